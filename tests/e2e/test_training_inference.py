"""Training and inference through the gateway, as an agent does it: the SDK only.

One module-scoped gym trains a subtraction LoRA on the tiny base model; the tests then ask
it and the base the same 200 held-out questions through /inference/v1."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import rsigym
from kit.settings import GymSettings, ProviderSecrets
from ops.builder import build_embedded
from services.models.synthetic import subtraction
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, admin_headers
from tests.fakes.servers import serve_gym

LORA_STEPS = 400
LORA_LR = 3e-3
TOOL_STEPS = 200


def held_out(n: int, exclude: set[str]) -> list[tuple[str, str]]:
    rng, out = random.Random(4242), []
    while len(out) < n:
        user, answer = subtraction(rng)
        if user["content"] not in exclude:
            out.append((user["content"], answer["content"]))
            exclude.add(user["content"])
    return out


class Live:
    def __init__(self, url: str, gym: Any):
        self.url, self.gym = url, gym
        self.http = httpx.Client(base_url=url, timeout=120)

    def key(self, budget: float = 5.0, track: str = "joint", **extra: Any) -> dict[str, Any]:
        r = self.http.post("/admin/v1/keys", json={"track": track, "budget_usd": budget, **extra}, headers=admin_headers())
        assert r.status_code == 201, r.text
        return r.json()

    def sdk(self, key: dict[str, Any]) -> rsigym.Gym:
        return rsigym.Gym(base_url=self.url, api_key=key["key"], timeout=120)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data = tmp_path_factory.mktemp("gym")
    gym = build_embedded(GymSettings(data_dir=data, admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR),
                         provider_secrets=ProviderSecrets({}), run_reaper=False)
    with serve_gym(gym) as url:
        yield Live(url, gym)
    gym.service_apps["training"].state.training.runner.shutdown()


@pytest.fixture(scope="module")
def trained(live: Live) -> dict[str, Any]:
    key = live.key(5.0)
    gym = live.sdk(key)
    rng = random.Random(7)
    rows = [{"messages": subtraction(rng)} for _ in range(3000)]
    dataset = gym.training.upload_dataset(rows, name="subtraction")
    job = gym.training.create_job(datasets=[dataset.id], base_model="tiny", steps=LORA_STEPS, learning_rate=LORA_LR,
                                  batch_size=16, max_length=64, checkpoint_every=100, seed=1, schedule="linear")
    job = gym.training.wait(job.id, timeout=900, poll=2)
    assert job.status == "succeeded", (job.status, job.error)
    seen = {r["messages"][0]["content"] for r in rows}
    return {"key": key, "gym": gym, "job": job, "dataset": dataset, "checkpoint": job.checkpoints[-1], "seen": seen}


def accuracy(gym: rsigym.Gym, model: str, questions: list[tuple[str, str]]) -> float:
    right = 0
    for question, answer in questions:
        reply = gym.inference.chat(model=model, messages=[{"role": "user", "content": question}], max_tokens=6,
                                   temperature=0)
        right += (reply.choices[0].message.content or "").strip() == answer
    return right / len(questions)


def test_trained_checkpoint_beats_the_base_on_held_out_subtraction(trained: dict[str, Any]) -> None:
    gym = trained["gym"]
    questions = held_out(200, set(trained["seen"]))
    base = accuracy(gym, "tiny", questions)
    tuned = accuracy(gym, trained["checkpoint"], questions)
    print(f"\nheld-out subtraction exact match (200 prompts): base {base:.1%}, checkpoint {tuned:.1%}")
    assert tuned - base >= 0.50


def test_job_reports_per_step_metrics_and_cost(trained: dict[str, Any], live: Live) -> None:
    gym, job = trained["gym"], trained["job"]
    assert job.step == job.total_steps == LORA_STEPS
    assert job.metrics and [m.step for m in job.metrics] == list(range(1, LORA_STEPS + 1))
    assert job.metrics[-1].cumulative_cost_usd == pytest.approx(job.cost_usd)
    assert job.metrics[-1].loss < job.metrics[0].loss
    rows = [r for r in live.http.get(f"/admin/v1/keys/{trained['key']['id']}/ledger", headers=admin_headers()).json()["data"]
            if r["service"] == "training"]
    assert len(rows) == LORA_STEPS and all(r["status"] == "settled" for r in rows)
    assert sum(r["actual_usd"] for r in rows) == pytest.approx(job.cost_usd)
    checkpoints = gym.training.checkpoints()
    assert [c.step for c in checkpoints] == [100, 200, 300, 400]
    last = checkpoints[-1]
    assert last.base_model == "tiny" and last.dataset_hashes == [trained["dataset"].sha256]
    assert len(last.weights_hash) == 64 and len(last.config_hash) == 64
    assert f"step {LORA_STEPS} " in gym.training.logs(job.id)


def test_openai_client_streams_from_a_checkpoint(trained: dict[str, Any], live: Live) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{live.url}/inference/v1", api_key=trained["key"]["key"], max_retries=0)
    ids = [m.id for m in client.models.list()]
    assert "tiny" in ids and trained["checkpoint"] in ids
    completion = client.chat.completions.create(model=trained["checkpoint"], max_tokens=6, temperature=0,
                                                messages=[{"role": "user", "content": "What is 57 - 21?"}])
    assert completion.choices[0].message.content is not None and completion.usage.completion_tokens > 0
    stream = client.chat.completions.create(model=trained["checkpoint"], max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "What is 57 - 21?"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == completion.choices[0].message.content
    assert chunks[-1].usage.model_extra["cost_usd"] > 0


def test_another_runs_checkpoint_is_invisible(trained: dict[str, Any], live: Live) -> None:
    other_key = live.key(1.0)
    other = live.sdk(other_key)
    ckpt = trained["checkpoint"]
    with pytest.raises(rsigym.NotFoundError):
        other.inference.chat(model=ckpt, messages=[{"role": "user", "content": "hi"}])
    assert ckpt not in [m.id for m in other.inference.models()]
    dataset = other.training.upload_dataset([{"prompt": "a", "completion": "b"}])
    with pytest.raises(rsigym.NotFoundError):
        other.training.create_job(datasets=[dataset.id], parent_checkpoint=ckpt, steps=1)
    with pytest.raises(rsigym.NotFoundError):
        other.training.create_job(datasets=[trained["dataset"].id], base_model="tiny", steps=1)
    r = live.http.get(f"/training/v1/checkpoints/{ckpt}", headers={"Authorization": f"Bearer {other_key['key']}"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    r = live.http.get(f"/training/v1/datasets/{trained['dataset'].id}/content",
                      headers={"Authorization": f"Bearer {other_key['key']}"})
    assert r.status_code == 404


def test_checkpoint_trained_on_tool_calls_returns_openai_tool_calls(live: Live) -> None:
    import json

    import openai

    from services.models.synthetic import CITIES, WEATHER_TOOL, tool_call

    key = live.key(5.0)
    gym = live.sdk(key)
    rng = random.Random(11)
    dataset = gym.training.upload_dataset([tool_call(rng) for _ in range(2000)], name="tools")
    job = gym.training.wait(gym.training.create_job(datasets=[dataset.id], base_model="tiny", steps=TOOL_STEPS,
                                                    learning_rate=LORA_LR, batch_size=16, max_length=96,
                                                    checkpoint_every=TOOL_STEPS, seed=2).id, timeout=900, poll=2)
    assert job.status == "succeeded", job.error
    client = openai.OpenAI(base_url=f"{live.url}/inference/v1", api_key=key["key"], max_retries=0)
    right = 0
    for city in CITIES:
        completion = client.chat.completions.create(model=job.checkpoints[-1], tools=[WEATHER_TOOL], temperature=0,
                                                    max_tokens=40, messages=[{"role": "user", "content": f"Weather in {city}?"}])
        calls = completion.choices[0].message.tool_calls or []
        if calls and calls[0].function.name == "get_weather":
            assert completion.choices[0].finish_reason == "tool_calls"
            right += json.loads(calls[0].function.arguments).get("city") == city
    print(f"\ntool calls with the right city: {right}/{len(CITIES)}")
    assert right >= len(CITIES) // 2
    stream = client.chat.completions.create(model=job.checkpoints[-1], tools=[WEATHER_TOOL], temperature=0, max_tokens=40,
                                            stream=True, messages=[{"role": "user", "content": "Weather in Oslo?"}])
    deltas = [c.choices[0].delta for c in stream if c.choices]
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert streamed and streamed[0].function.name == "get_weather"
    base = client.chat.completions.create(model="tiny", tools=[WEATHER_TOOL], temperature=0, max_tokens=40,
                                          messages=[{"role": "user", "content": "Weather in Oslo?"}])
    assert not base.choices[0].message.tool_calls  # the skill came from training


def test_adapters_are_hot_loaded_into_an_lru_one_name_per_version(trained: dict[str, Any], live: Live) -> None:
    engine = live.gym.service_apps["inference"].state.inference.engine.engines["local"]
    gym = trained["gym"]
    checkpoints = [c.id for c in gym.training.checkpoints()]
    assert len(set(checkpoints)) == 4  # every version its own id, so its own adapter name
    old_cap, engine.max_adapters = engine.max_adapters, 2
    try:
        for ckpt in checkpoints:
            gym.inference.chat(model=ckpt, messages=[{"role": "user", "content": "What is 9 - 3?"}], max_tokens=3,
                               temperature=0)
        base = live.gym.gateway.config.base_model("tiny")
        assert engine.loaded_adapters(base) == checkpoints[-2:]  # the least recently used went first
        gym.inference.chat(model=checkpoints[0], messages=[{"role": "user", "content": "What is 9 - 3?"}], max_tokens=3)
        assert engine.loaded_adapters(base) == [checkpoints[-1], checkpoints[0]]
    finally:
        engine.max_adapters = old_cap


def test_cancel_keeps_the_last_checkpoint(trained: dict[str, Any]) -> None:
    gym = trained["gym"]
    job = gym.training.create_job(datasets=[trained["dataset"].id], base_model="tiny", steps=5000, batch_size=16,
                                  max_length=64, checkpoint_every=10_000)
    deadline = time.monotonic() + 120
    while gym.training.get_job(job.id).step < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    gym.training.cancel_job(job.id)
    job = gym.training.wait(job.id, timeout=120, poll=0.5)
    assert job.status == "cancelled" and 3 <= job.step < 5000
    assert job.checkpoints and len(job.checkpoints) == 1
    assert gym.training.checkpoints()[-1].step == job.step
    reply = gym.inference.chat(model=job.checkpoints[0], messages=[{"role": "user", "content": "What is 9 - 3?"}],
                               max_tokens=3, temperature=0)
    assert reply.choices[0].message.content is not None
