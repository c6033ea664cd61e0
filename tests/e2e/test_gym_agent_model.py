"""The research agent's model served by the gym itself (issue 58 item 3): a base model of the gym
(a ``served_by = "gym"`` catalogue entry) and an ended run's accepted, scored checkpoint
(``gym:<checkpoint id>``), through the inference service on the agent route, called with the
unmodified openai SDK and the run key; billed on the agent-model meter at the inference price
(never the service budget); its turns kept. Refused: an unknown or unaccepted checkpoint, the
run's own checkpoint, a gym model the run was not started with; and the run gets no inference
grant to the agent model's checkpoint."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from billing.money import nusd_to_usd
from kit.config import GymConfig
from services.evaluation.tables import ScoreRow, SubmissionRow
from services.inference.service import chat_cost
from services.models.loading import resolve_model_dir
from services.records.tables import AuditRow
from services.training.checkpoints import CheckpointRegistry
from services.training.tables import TrainingJob
from storage.tables import ApiKey
from tests.conftest import MODELS_DIR, admin_headers, bearer, gym_config
from tests.fakes.servers import serve_gym
from tests.fakes.tiny_lora import random_lora

QUESTION = "What is 2 + 3?"


def _config(api_base: str) -> GymConfig:
    config = gym_config(api_base)
    return config.model_copy(update={"agent_models": GymConfig.model_validate({"agent_models": [
        {"name": "self-tiny", "served_by": "gym", "gym_model": "tiny"}]}).agent_models})


def _run_key(client: httpx.Client, agent_model: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"track": "joint", "budget_usd": 1.0, "agent_budget_usd": 1.0}
    if agent_model is not None:
        body["run"] = {"task": "t", "agent": "a", "agent_model": agent_model}
    created = client.post("/admin/v1/keys", json=body, headers=admin_headers())
    assert created.status_code == 201, created.text
    return created.json()


class _Saved:
    """A LoRA already written to disk, saved again where the registry says."""

    def __init__(self, path: Path):
        self.path = path

    def save_pretrained(self, out: Path) -> None:
        shutil.copytree(self.path, out)


def _checkpoint(gym: Any, tmp_path: Path, run_id: str) -> str:
    tiny = resolve_model_dir(gym.gateway.config.base_model("tiny"), MODELS_DIR)
    lora = random_lora(tiny, tmp_path / f"lora-{run_id}", seed=7)
    registry = CheckpointRegistry.of(gym.gateway.context)
    job_id = f"ftjob_{run_id}"
    with gym.gateway.store.transaction() as s:
        s.add(TrainingJob(id=job_id, run_id=run_id, key_id=run_id, status="succeeded", base_model="tiny",
                          parent_checkpoint_id=None, dataset_ids=[], config={}, config_hash="c" * 64,
                          loss_module_hash=None, experiment_id=None, total_steps=1))
    view = registry.save(model=_Saved(lora), run_id=run_id, job_id=job_id, base_model="tiny", parent=None,
                         dataset_hashes=[], config_hash="c", loss_module_hash=None, step=1, metrics={})
    return str(view["id"])


def _ended_and_judged(gym: Any, run_id: str, ckpt: str, audit: str = "accepted") -> None:
    """Run ``run_id`` ended, its final submission ``ckpt`` audited (``audit``) and scored."""
    with gym.gateway.store.transaction() as s:
        run = s.get(ApiKey, run_id)
        run.ends_at = run.ended_at = datetime.now(UTC)  # as scoring ends a run: its deadline now, reaped
        s.add(SubmissionRow(id=f"sub_{run_id}", run_id=run_id, key_id=run_id, track="joint", checkpoint_id=ckpt,
                            model=ckpt, harness="minimal"))
        s.add(AuditRow(id=f"aud_{run_id}", run_id=run_id, status=audit, hacking_rate=0.0,
                       report={"submission": {"id": f"sub_{run_id}"}}))
        s.add(ScoreRow(id=f"score_{run_id}", run_id=run_id, submission_id=f"sub_{run_id}", benchmark="b",
                       split="test", model=ckpt, harness="minimal", attempts=1, job_id="job_s", score=0.5,
                       status="succeeded"))


def _balance(client: httpx.Client, key: str) -> dict[str, Any]:
    return client.get("/v1/balance", headers=bearer(key)).json()


def _trajectory(client: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    return client.get(f"/admin/v1/runs/{run_id}/trajectory", headers=admin_headers()).json()["data"]


def _exact_cost_usd(gym: Any, usage: Any) -> float:
    return nusd_to_usd(chat_cost(gym.gateway.config.base_model("tiny"), usage.prompt_tokens, usage.completion_tokens))


@pytest.fixture
def live(make_gym: Any, standin: Any) -> Any:
    gym = make_gym(config=_config(standin[0]))
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield gym, url, client


def test_a_base_model_of_the_gym_answers_on_the_agent_route_at_the_inference_price(live: Any) -> None:
    gym, url, client = live
    key = _run_key(client)
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key["key"], max_retries=0)
    assert "self-tiny" in [m.id for m in oai.models.list()]
    raw = oai.chat.completions.with_raw_response.create(
        model="self-tiny", messages=[{"role": "user", "content": QUESTION}], max_tokens=8, temperature=0)
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    plain = _exact_cost_usd(gym, completion.usage)
    assert float(raw.headers["X-RSIGym-Cost-USD"]) == pytest.approx(plain, abs=1e-9)
    chunks = list(oai.chat.completions.create(model="self-tiny", messages=[{"role": "user", "content": QUESTION}],
                                              max_tokens=8, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == completion.choices[0].message.content  # greedy: the same answer
    assert chunks[-1].usage is not None
    stream_cost = _exact_cost_usd(gym, chunks[-1].usage)

    balance = _balance(client, key["key"])
    assert balance["spent_usd"] == 0 and balance["reserved_usd"] == 0  # the service budget is not charged
    assert balance["agent_model"]["spent_usd"] == pytest.approx(plain + stream_cost, abs=1e-9)
    assert balance["agent_model"]["reserved_usd"] == 0
    turns = _trajectory(client, key["id"])
    assert [(t["api"], t["stream"], t["model"]) for t in turns] == [("openai", False, "self-tiny"),
                                                                     ("openai", True, "self-tiny")]
    assert [t["response"]["text"] for t in turns] == [streamed, streamed]
    assert turns[0]["request"]["messages"][0]["content"] == QUESTION
    assert turns[0]["cost_usd"] == pytest.approx(plain, abs=1e-9)

    # Only chat completions are spoken for a gym model; refused before anything is reserved.
    refused = client.post("/agent/v1/responses", json={"model": "self-tiny", "input": "hi"}, headers=bearer(key["key"]))
    assert refused.status_code == 422 and "chat completions" in refused.json()["error"]["message"]
    assert _balance(client, key["key"])["agent_model"]["spent_usd"] == pytest.approx(plain + stream_cost, abs=1e-9)


def test_an_earlier_runs_accepted_checkpoint_is_the_next_runs_agent_model(live: Any, tmp_path: Path) -> None:
    gym, url, client = live
    earlier = _run_key(client)
    ckpt = _checkpoint(gym, tmp_path, earlier["id"])
    _ended_and_judged(gym, earlier["id"], ckpt)
    key = _run_key(client, agent_model=f"gym:{ckpt}")
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key["key"], max_retries=0)
    listed = {m.id: m for m in oai.models.list()}
    assert f"gym:{ckpt}" in listed and "self-tiny" in listed
    completion = oai.chat.completions.create(model=f"gym:{ckpt}", messages=[{"role": "user", "content": QUESTION}],
                                             max_tokens=8, temperature=0)
    base = oai.chat.completions.create(model="self-tiny", messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=8, temperature=0)
    assert completion.choices[0].message.content != base.choices[0].message.content  # the LoRA answers
    assert completion.usage is not None and base.usage is not None
    balance = _balance(client, key["key"])
    assert balance["spent_usd"] == 0
    assert balance["agent_model"]["spent_usd"] == pytest.approx(
        _exact_cost_usd(gym, completion.usage) + _exact_cost_usd(gym, base.usage), abs=1e-9)
    assert [t["model"] for t in _trajectory(client, key["id"])] == [f"gym:{ckpt}", "self-tiny"]

    # The agent route grants nothing else: the checkpoint is not the run's on the inference route.
    door = client.post("/inference/v1/chat/completions", headers=bearer(key["key"]),
                       json={"model": ckpt, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4})
    assert door.status_code == 404


def test_refusals_unknown_unaccepted_own_and_unchosen(live: Any, tmp_path: Path) -> None:
    gym, url, client = live

    def ask(key: dict[str, Any], model: str) -> httpx.Response:
        return client.post("/agent/v1/chat/completions", headers=bearer(key["key"]),
                           json={"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4})

    def started_with(model: str) -> dict[str, Any]:
        """A run key recording ``model`` as its agent model, as if it had been eligible when minted."""
        key = _run_key(client, agent_model="gym:tiny")
        with gym.gateway.store.transaction() as s:
            s.get(ApiKey, key["id"]).agent_model = model
        return key

    keys_before = len(client.get("/admin/v1/keys", headers=admin_headers()).json()["data"])
    for model, status in (("gym:ckpt_nosuchthing", 404), ("gym:from:key_nosuchrun", 404)):  # refused at the mint
        minted = client.post("/admin/v1/keys", headers=admin_headers(), json={
            "track": "joint", "budget_usd": 1.0, "agent_budget_usd": 1.0,
            "run": {"task": "t", "agent": "a", "agent_model": model}})
        assert minted.status_code == status, minted.text
    assert len(client.get("/admin/v1/keys", headers=admin_headers()).json()["data"]) == keys_before

    unknown = started_with("gym:ckpt_nosuchthing")
    assert ask(unknown, "gym:ckpt_nosuchthing").status_code == 404

    flagged_run = _run_key(client)
    flagged = _checkpoint(gym, tmp_path, flagged_run["id"])
    _ended_and_judged(gym, flagged_run["id"], flagged, audit="flagged")
    minted = client.post("/admin/v1/keys", headers=admin_headers(), json={
        "track": "joint", "budget_usd": 1.0, "run": {"task": "t", "agent": "a", "agent_model": f"gym:{flagged}"}})
    assert minted.status_code == 403 and "audit-accepted" in minted.json()["error"]["message"]
    user = started_with(f"gym:{flagged}")  # a checkpoint flagged after the run started: refused on every call
    refused = ask(user, f"gym:{flagged}")
    assert refused.status_code == 403 and "audit-accepted" in refused.json()["error"]["message"]
    refused = ask(user, f"gym:from:{flagged_run['id']}")  # not the model it was started with
    assert refused.status_code == 403 and "not this run's agent model" in refused.json()["error"]["message"]

    own_run = _run_key(client, agent_model="gym:tiny")
    own = _checkpoint(gym, tmp_path, own_run["id"])
    with gym.gateway.store.transaction() as s:
        s.get(ApiKey, own_run["id"]).agent_model = f"gym:{own}"
    refused = ask(own_run, f"gym:{own}")
    assert refused.status_code == 403 and "own checkpoint" in refused.json()["error"]["message"]

    for key in (unknown, user, own_run):  # refusals are free
        assert _balance(client, key["key"])["agent_model"]["spent_usd"] == 0
        assert _trajectory(client, key["id"]) == []
