"""Training under the gym's rules: per-step budgets, fixed fields, sandboxed custom losses,
validated datasets and audit access."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rsigym
from billing.money import token_cost_nusd
from tests.conftest import admin_headers, bearer, create_key
from tests.fakes.servers import serve_gym

# Every row renders to the same number of tokens, so every step costs the same.
ROWS = [{"messages": [{"role": "user", "content": "Repeat: red lion"}, {"role": "assistant", "content": "red lion"}]}] * 64


@pytest.fixture
def live(gym: Any) -> Iterator[tuple[str, Any, Any]]:
    import httpx

    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=120) as http:
        yield url, http, gym


def test_budget_for_30_steps_stops_the_job_and_keeps_a_servable_checkpoint(live: Any) -> None:
    url, http, gym = live
    probe = rsigym.Gym(base_url=url, api_key=create_key(http, 5.0)["key"])
    ds = probe.training.upload_dataset(ROWS)
    first = probe.training.wait(probe.training.create_job(datasets=[ds.id], base_model="tiny", steps=1, batch_size=8,
                                                          max_length=64).id, timeout=300)
    per_step = first.metrics[0].cost_usd
    assert per_step == token_cost_nusd(first.metrics[0].tokens, 2.0) / 1e9

    budget = per_step * 30.5
    key = create_key(http, budget)
    agent = rsigym.Gym(base_url=url, api_key=key["key"])
    ds = agent.training.upload_dataset(ROWS)
    job = agent.training.create_job(datasets=[ds.id], base_model="tiny", steps=100, batch_size=8, max_length=64,
                                    checkpoint_every=1000)
    job = agent.training.wait(job.id, timeout=600)
    assert job.status == "budget_exhausted" and job.step == 30
    assert "step 31" in (job.error or "")
    balance = agent.balance()
    assert balance.spent_usd <= balance.budget_usd and balance.reserved_usd == 0
    assert balance.spent_usd == pytest.approx(30 * per_step)
    rows = [r for r in http.get(f"/admin/v1/keys/{key['id']}/ledger", headers=admin_headers()).json()["data"]
            if r["service"] == "training"]
    assert len(rows) == 30 and {r["status"] for r in rows} == {"settled"}  # nothing for unperformed steps
    assert job.checkpoints and len(job.checkpoints) == 1
    reply = agent.inference.chat(model=job.checkpoints[0], messages=[{"role": "user", "content": "Repeat: red lion"}],
                                 max_tokens=4, temperature=0)
    assert reply.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("override", "param"),
    [({"lora": {"rank": 64}}, "lora.rank"), ({"learning_rate": 0.1}, "learning_rate"), ({"steps": 5000}, "steps"),
     ({"lora": {"alpha": 1}}, "lora.alpha"), ({"loss": "custom", "custom_loss": "x"}, "loss"),
     ({"lora": {"rank": "16"}}, "lora.rank"), ({"lora.rank": 64}, "lora.rank"),
     ({"lora": {"target_modules": ["q_proj"]}}, "lora.target_modules"), ({"batch_size": 64}, "batch_size")],
)
def test_data_track_cannot_change_a_fixed_training_field(live: Any, override: dict[str, Any], param: str) -> None:
    url, http, gym = live
    key = create_key(http, 1.0, track="data")["key"]
    agent = rsigym.Gym(base_url=url, api_key=key)
    ds = agent.training.upload_dataset(ROWS)
    with pytest.raises(rsigym.PermissionDeniedError) as info:
        agent.training.create_job(datasets=[ds.id], base_model="tiny", **override)
    assert info.value.param == param


def test_data_track_job_gets_the_fixed_values_filled_in(live: Any) -> None:
    url, http, gym = live
    key = create_key(http, 1.0, track="data")["key"]
    agent = rsigym.Gym(base_url=url, api_key=key)
    ds = agent.training.upload_dataset(ROWS)
    job = agent.training.create_job(datasets=[ds.id], base_model="tiny")
    agent.training.cancel_job(job.id)
    assert job.config["lora"]["rank"] == 16 and job.config["learning_rate"] == 0.001 and job.total_steps == 400


GOOD_LOSS = """
import torch
def loss(logits, labels, mask):
    logp = torch.log_softmax(logits, -1)
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * mask).sum() / mask.sum()
"""

BAD_LOSSES = {
    "reads the environment": """
import os
def loss(logits, labels, mask):
    secret = os.environ["RSIGYM_TEST_PLATFORM_SECRET"]
    return logits.sum() * 0
""",
    "opens a socket": """
import socket
def loss(logits, labels, mask):
    socket.create_connection(("127.0.0.1", 5432), timeout=2)
    return logits.sum() * 0
""",
    "writes outside its dir": """
def loss(logits, labels, mask):
    open(%r, "w").write("escaped")
    return logits.sum() * 0
""",
}


def test_a_custom_loss_trains(live: Any) -> None:
    url, http, gym = live
    agent = rsigym.Gym(base_url=url, api_key=create_key(http, 1.0)["key"])
    ds = agent.training.upload_dataset(ROWS)
    job = agent.training.wait(agent.training.create_job(datasets=[ds.id], base_model="tiny", steps=2, batch_size=8,
                                                        max_length=64, loss="custom", custom_loss=GOOD_LOSS).id,
                              timeout=300)
    assert job.status == "succeeded", job.error
    assert all(m.loss > 0 for m in job.metrics or [])
    ckpt = agent.training.checkpoints()[-1]
    assert ckpt.loss_module_hash and len(ckpt.loss_module_hash) == 64


@pytest.mark.parametrize("case", sorted(BAD_LOSSES))
def test_a_custom_loss_cannot_reach_secrets_network_or_the_host(live: Any, case: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    url, http, gym = live
    secret = "platform-secret-" + os.urandom(8).hex()
    monkeypatch.setenv("RSIGYM_TEST_PLATFORM_SECRET", secret)
    target = Path(sys.prefix) / f"escaped-{os.urandom(4).hex()}.txt"  # a host dir the sandbox sees read-only
    source = BAD_LOSSES[case] % str(target) if "%r" in BAD_LOSSES[case] else BAD_LOSSES[case]
    key = create_key(http, 1.0)
    agent = rsigym.Gym(base_url=url, api_key=key["key"])
    ds = agent.training.upload_dataset(ROWS)
    job = agent.training.wait(agent.training.create_job(datasets=[ds.id], base_model="tiny", steps=3, batch_size=8,
                                                        max_length=64, loss="custom", custom_loss=source).id, timeout=300)
    assert job.status == "failed" and job.step == 0
    assert (job.error or "").startswith("step 1: custom loss failed")
    expected = {"reads the environment": "KeyError", "opens a socket": "Connection", "writes outside its dir": "Read-only"}
    assert expected[case] in job.error
    logs = agent.training.logs(job.id)
    assert secret not in job.error and secret not in logs
    assert not target.exists()
    # The failed step's tokens were not charged; the loss's wall seconds were (they held a shared
    # worker), never more than its per-step cap.
    training = gym.gateway.context.config.training
    cap_usd = training.custom_loss_timeout_s * training.custom_loss_usd_per_hour / 3600
    balance = agent.balance()
    assert 0 < balance.spent_usd <= cap_usd and balance.reserved_usd == 0


def test_datasets_are_validated_line_by_line_and_stored_once(live: Any) -> None:
    url, http, gym = live
    key = create_key(http, 1.0)
    agent = rsigym.Gym(base_url=url, api_key=key["key"])
    bad = (json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n"
           + "{not json\n" + json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n"
           + json.dumps({"prompt": 1, "completion": "x"}) + "\n").encode()
    with pytest.raises(rsigym.UnprocessableEntityError) as info:
        agent.training.upload_dataset(bad)
    message = info.value.message
    assert "line 2" in message and "line 3" in message and "line 4" in message and "line 1:" not in message
    blobs = gym.gateway.context.data_dir / "datasets"
    assert not blobs.exists() or not any(blobs.iterdir())
    first = agent.training.upload_dataset(ROWS, name="copy")
    again = agent.training.upload_dataset(ROWS)
    assert again.id == first.id and len(list(blobs.iterdir())) == 1
    other = rsigym.Gym(base_url=url, api_key=create_key(http, 1.0)["key"]).training.upload_dataset(ROWS)
    assert other.id != first.id and other.sha256 == first.sha256 and len(list(blobs.iterdir())) == 1
    audit = http.get(f"/admin/v1/datasets/{first.id}/content", headers=admin_headers())
    assert audit.status_code == 200 and audit.content == b"".join(json.dumps(r).encode() + b"\n" for r in ROWS)
    assert http.get(f"/admin/v1/datasets/{first.id}/content", headers=bearer(key["key"])).status_code == 401
