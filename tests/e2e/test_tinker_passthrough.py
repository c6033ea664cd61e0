"""The Tinker API passed through to Tinker: a base model the operator runs on Tinker
(``backend = "tinker"``) is trained, sampled and saved upstream, driven by the unmodified
``tinker`` SDK as the agent (``tml-<run key>``).

There is no Tinker account here: upstream is tests/fakes/tinker_wire.py, which speaks Tinker's
wire protocol (the real SDK is the gym's client of it) and accepts only the platform's key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from kit.config import GymConfig
from services.models.tinker_client import tinker_manifest
from tests.conftest import ADMIN_TOKEN, TEACHER_ENV, bearer, client_for, create_key, gym_config
from tests.fakes.servers import serve, serve_gym
from tests.fakes.tinker_wire import FAKE_OPERATOR_KEY, TinkerWire

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
CLOUD = "tiny-cloud"


def _datum(tokens: list[int]) -> Any:
    inputs: dict[str, Any] = {"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def _config(api_base: str) -> GymConfig:
    """The tests' config plus ``tiny-cloud``: the tiny model as the operator runs it on Tinker
    (upstream's ``tiny``), the joint track's base model."""
    data = gym_config(api_base).model_dump(mode="json")
    tiny = next(m for m in data["models"] if m["name"] == "tiny")
    data["models"].append({**tiny, "name": CLOUD, "backend": "tinker", "tinker_base_model": "tiny"})
    data["tracks"]["base_model"] = CLOUD
    return GymConfig.model_validate(data)


@pytest.fixture
def passthrough(make_gym: Callable[..., Any], standin: tuple[str, Any], teacher_secret: str,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str, TinkerWire, str]]:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    upstream = make_gym()
    with client_for(upstream) as admin:
        upstream_key = create_key(admin, budget_usd=5.0, track="joint")["key"]
    wire = TinkerWire(upstream.app, upstream_key)
    with serve(wire) as wire_url:
        monkeypatch.setenv("TINKER_BASE_URL", wire_url)  # the SDK's own setting: inference's client reads it
        gym = make_gym(config=_config(standin[0]), secrets_={
            TEACHER_ENV: teacher_secret, "TINKER_API_KEY": FAKE_OPERATOR_KEY, "TINKER_BASE_URL": wire_url})
        with serve_gym(gym) as url:
            yield gym, url, wire, wire_url


def _ledger(client: Any, key: str) -> list[dict[str, Any]]:
    key_id = client.get("/v1/key", headers=bearer(key)).json()["id"]
    got = client.get(f"/admin/v1/keys/{key_id}/ledger", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert got.status_code == 200, got.text
    return list(got.json()["data"])


def test_a_tinker_base_model_is_passed_through_upstream(passthrough: tuple[Any, str, TinkerWire, str]) -> None:
    gym, url, wire, wire_url = passthrough
    with client_for(gym) as admin:
        key = create_key(admin, budget_usd=5.0, track="joint")["key"]
    service = tinker.ServiceClient(base_url=f"{url}/tinker", api_key="tml-" + key)
    trainer = service.create_lora_training_client(base_model=CLOUD, rank=4, seed=0).result()
    batch = [_datum(PROMPT), _datum(PROMPT[::-1])]
    losses = []
    for _ in range(5):
        out = trainer.forward_backward(batch, "cross_entropy").result()
        losses.append(out.metrics["loss:sum"])
        trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert losses[-1] < losses[0], losses
    assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == len(PROMPT) - 1

    state = trainer.save_state("s1").result().path
    assert state.startswith(f"tinker://{trainer.model_id}/weights/state_"), state
    trainer.load_state_with_optimizer(state).result()

    saved = trainer.save_weights_for_sampler("final").result().path
    assert saved.startswith(f"tinker://{trainer.model_id}/sampler_weights/ckpt_"), saved
    sampler = service.create_sampling_client(model_path=saved).result()
    res = sampler.sample(types.ModelInput.from_ints(PROMPT[:4]), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=1)).result()
    assert len(res.sequences) == 2 and all(1 <= len(s.tokens) <= 5 for s in res.sequences)

    # Carried out upstream, with the platform's key only (never the agent's).
    routes = wire.routes()
    for route in ("create_model", "forward_backward", "optim_step", "save_weights", "load_weights",
                  "save_weights_for_sampler", "create_sampling_session", "asample"):
        assert route in routes, (route, routes)
    assert wire.keys_seen() == {FAKE_OPERATOR_KEY}

    # A registered checkpoint: a tinker.json naming the upstream path (which the agent never saw).
    ckpt = saved.rsplit("/", 1)[-1]
    training = gym.service_apps["training"].state.training
    with client_for(gym) as client:
        row = client.get(f"/training/v1/checkpoints/{ckpt}", headers=bearer(key))
        assert row.status_code == 200, row.text
        assert row.json()["base_model"] == CLOUD and row.json()["dataset_hashes"]  # the loop data, recorded
        manifest = tinker_manifest(training.registry.get(ckpt, run_id=None).path)  # a platform read
        assert manifest is not None and manifest["base_model"] == "tiny"
        assert manifest["path"].startswith("tinker://") and manifest["path"] != saved
        assert "/sampler_weights/" in manifest["path"]
        served = client.post("/inference/v1/chat/completions", headers=bearer(key),
                             json={"model": ckpt, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert served.status_code == 200, served.text  # inference's tinker backend, from the manifest
        submitted = client.post("/evaluation/v1/submissions", headers=bearer(key),
                                json={"checkpoint": ckpt, "harness": "minimal"})
        assert submitted.status_code in (200, 201), submitted.text

        # An upstream failure is the platform's (503), and its hold is released.
        wire.fail("forward_backward")
        with pytest.raises(tinker.RequestFailedError) as err:
            trainer.forward_backward(batch, "cross_entropy").result()
        assert "service_unavailable (503)" in str(err.value) and "tinker://" + "ftjob" not in str(err.value)
        assert str(err.value.category).lower().endswith("server")

        entries = _ledger(client, key)
        ops = {e.get("operation") for e in entries}
        assert {"tinker.forward_backward", "tinker.sample"} <= ops, ops
        assert "reserved" not in {e.get("status") for e in entries}
    assert wire.keys_seen() == {FAKE_OPERATOR_KEY}
    # The fake is strict about its key: the agent's own is refused there.
    refused = httpx.post(f"{wire_url}/api/v1/create_session", headers={"X-API-Key": "tml-" + key}, json={})
    assert refused.status_code == 401
    service.holder.close()
