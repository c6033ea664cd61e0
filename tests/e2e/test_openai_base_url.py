"""One OpenAI base URL (issue 16, item 7): the unmodified ``openai`` client pointed at
``<gym>/openai/v1`` lists and calls every model the key may use — catalogue teachers, base models
and the run's own checkpoints — billed exactly as on ``/rollout/v1`` and ``/inference/v1``, refused
exactly as there, and seeing nothing another run owns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kit.ids import new_id
from services.models.loading import resolve_model_dir
from services.training.checkpoints import Checkpoint
from services.training.tables import TrainingJob
from storage.store import Store
from tests.conftest import MODELS_DIR, admin_headers, bearer, create_key
from tests.fakes.servers import serve_gym
from tests.fakes.tiny_lora import random_lora

QUESTION: list[Any] = [{"role": "user", "content": "What is 20 + 22?"}]


@pytest.fixture
def store(sqlite_store: Store) -> Store:
    return sqlite_store


@pytest.fixture
def gym(make_gym: Callable[..., Any], store: Store) -> Iterator[tuple[str, Any]]:
    built = make_gym(store=store)
    with serve_gym(built) as url:
        yield url, built


def add_checkpoint(store: Store, run_id: str, adapter: Path) -> str:
    """A checkpoint of the run's, as a training job registers one (its adapter on disk)."""
    job_id, ckpt_id = new_id("trj"), new_id("ckpt")
    with store.transaction() as s:
        s.add(TrainingJob(id=job_id, run_id=run_id, key_id=run_id, status="succeeded", base_model="tiny",
                          dataset_ids=[], config={}, config_hash="0" * 64, total_steps=1, step=1))
        s.flush()
        s.add(Checkpoint(id=ckpt_id, run_id=run_id, job_id=job_id, base_model="tiny", dataset_hashes=[],
                         config_hash="0" * 64, step=1, metrics={}, weights_hash="1" * 64, path=str(adapter)))
    return ckpt_id


def ledger(url: str, key_id: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/admin/v1/keys/{key_id}/ledger", headers=admin_headers()).json()["data"]


def test_one_client_reaches_teachers_bases_and_checkpoints(gym: tuple[str, Any], store: Store, tmp_path: Path) -> None:
    url, built = gym
    with httpx.Client(base_url=url) as c:
        run, other = create_key(c, 2.0), create_key(c, 2.0)
    adapter = random_lora(resolve_model_dir(built.gateway.config.models[0], MODELS_DIR), tmp_path / "lora", seed=3)
    mine, theirs = add_checkpoint(store, run["id"], adapter), add_checkpoint(store, other["id"], adapter)
    client = openai.OpenAI(base_url=f"{url}/openai/v1", api_key=run["key"], max_retries=0)

    listed = [m.id for m in client.models.list()]
    assert listed[:2] == ["teacher", "judge"] and "tiny" in listed and mine in listed
    assert theirs not in listed

    taught = client.chat.completions.with_raw_response.create(model="teacher", messages=QUESTION, max_tokens=8)
    assert taught.parse().choices[0].message.content == "42"
    # min_tokens (the inference service's vLLM parameter): a sampled answer may otherwise end at
    # its first token (a fresh clone's CI run once drew that), and this test is about the route
    at_least_one: dict[str, Any] = {"min_tokens": 1}
    based = client.chat.completions.with_raw_response.create(model="tiny", messages=QUESTION, max_tokens=4,
                                                             extra_body=at_least_one)
    tuned = client.chat.completions.create(model=mine, messages=QUESTION, max_tokens=4, extra_body=at_least_one)
    for usage in (based.parse().usage, tuned.usage):
        assert usage is not None and usage.completion_tokens >= 1
    streamed = list(client.chat.completions.create(model="teacher", messages=QUESTION, max_tokens=8, stream=True,
                                                   stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices) == "42"

    # billed as the services' own routes bill: one settled row each, under the right service
    rows = ledger(url, run["id"])
    assert [(r["service"], r["operation"], r["status"]) for r in rows] == [
        ("rollout", "chat.completions", "settled"), ("inference", "chat.completions", "settled"),
        ("inference", "chat.completions", "settled"), ("rollout", "chat.completions", "settled")]
    assert float(taught.headers["X-RSIGym-Cost-USD"]) == pytest.approx(rows[0]["actual_usd"])
    assert float(based.headers["X-RSIGym-Cost-USD"]) == pytest.approx(rows[1]["actual_usd"])
    with httpx.Client(base_url=url) as c:  # the same call on the rollout route costs the same
        direct = c.post("/rollout/v1/chat/completions", headers=bearer(run["key"]),
                        json={"model": "teacher", "messages": QUESTION, "max_tokens": 8})
    assert direct.headers["X-RSIGym-Cost-USD"] == taught.headers["X-RSIGym-Cost-USD"]

    with pytest.raises(openai.NotFoundError):  # another run's checkpoint is not this key's to call
        client.chat.completions.create(model=theirs, messages=QUESTION, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=4)
    assert len(ledger(url, run["id"])) == 5  # the four calls and the direct one: the unknown models reserved nothing


def test_refusals_on_the_one_url_are_the_services_refusals(gym: tuple[str, Any], store: Store) -> None:
    url, _ = gym
    with httpx.Client(base_url=url) as c:
        harness = create_key(c, 1.0, track="harness")  # no rollout, only the instruct model
        poor = create_key(c, 0.000001)
    client = openai.OpenAI(base_url=f"{url}/openai/v1", api_key=harness["key"], max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]  # no catalogue, and no refusal recorded for it
    with httpx.Client(base_url=url) as c:
        events = c.get(f"/admin/v1/runs/{harness['id']}/events", headers=admin_headers()).json()["data"]
    assert not [e for e in events if e["kind"] == "call.refused"]

    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="teacher", messages=QUESTION, max_tokens=8)
    broke = openai.OpenAI(base_url=f"{url}/openai/v1", api_key=poor["key"], max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        broke.chat.completions.create(model="teacher", messages=QUESTION, max_tokens=512)
    assert refused.value.status_code == 402
    assert ledger(url, poor["id"]) == []  # refused before any reservation
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/openai/v1", api_key="rsk-forged", max_retries=0).models.list()
