"""The unmodified ``tinker`` SDK against an embedded gym (``$RSIGYM_URL/tinker``, ``tml-`` + run
key): a supervised loop on the tiny base model, sampling from its saved weights, forward,
save/load state, a data-track refusal, budget exhaustion mid-loop, and the loop's checkpoint
served by inference and listed for submission."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import admin_headers, bearer, client_for, create_key
from tests.fakes.servers import serve_gym

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.timeout(300)

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def _datum(tokens: list[int]) -> Any:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


@pytest.fixture
def served(make_gym: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    gym = make_gym()
    with serve_gym(gym) as url:
        yield gym, url


def _service(url: str, key: str) -> Any:
    return tinker.ServiceClient(base_url=f"{url}/tinker", api_key="tml-" + key)


def test_supervised_loop_sample_state_and_checkpoint(served: tuple[Any, str]) -> None:
    gym, url = served
    with client_for(gym) as admin:
        key = create_key(admin, budget_usd=5.0, track="joint")["key"]
    service = _service(url, key)
    trainer = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    batch = [_datum(PROMPT), _datum(PROMPT[::-1])]
    losses = []
    for _ in range(6):
        out = trainer.forward_backward(batch, "cross_entropy").result()
        losses.append(out.metrics["loss:sum"])
        trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert losses[-1] < losses[0], losses
    assert len(out.loss_fn_outputs) == 2 and len(out.loss_fn_outputs[0]["logprobs"].tolist()) == len(PROMPT) - 1

    fwd = trainer.forward(batch, "cross_entropy").result()
    assert len(fwd.loss_fn_outputs) == 2

    state = trainer.save_state("s1").result().path
    assert state.startswith("tinker://")
    trainer.load_state(state).result()
    trainer.load_state_with_optimizer(state).result()
    # a new training client from the saved state: the SDK names the new model itself
    # (`<session>:train:<seq>`, as Tinker derives it) and goes on with it
    resumed = service.create_training_client_from_state_with_optimizer(state).result()
    assert resumed.forward(batch, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"], rel=1e-5)
    resumed.forward_backward(batch, "cross_entropy").result()
    resumed.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert service.create_training_client_from_state(state).result().forward(batch, "cross_entropy").result()

    saved = trainer.save_weights_for_sampler("final").result().path
    assert saved.startswith("tinker://") and "/sampler_weights/ckpt_" in saved
    sampler = service.create_sampling_client(model_path=saved).result()
    res = sampler.sample(types.ModelInput.from_ints(PROMPT[:4]), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=1)).result()
    assert len(res.sequences) == 2 and all(1 <= len(s.tokens) <= 5 for s in res.sequences)

    ckpt = saved.rsplit("/", 1)[-1]
    with client_for(gym) as client:
        row = client.get(f"/training/v1/checkpoints/{ckpt}", headers=bearer(key))
        assert row.status_code == 200, row.text
        assert row.json()["base_model"] == "tiny" and row.json()["dataset_hashes"]
        assert row.json()["metrics"]["tinker"]["loss_fns"] == ["cross_entropy"]
        served_ = client.post("/inference/v1/chat/completions", headers=bearer(key),
                              json={"model": ckpt, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert served_.status_code == 200, served_.text
        submitted = client.post("/evaluation/v1/submissions", headers=bearer(key), json={"checkpoint": ckpt, "harness": "minimal"})
        assert submitted.status_code in (200, 201), submitted.text
        ledger = client.get(f"/admin/v1/keys/{_key_id(client, key)}/ledger",
                            headers={"Authorization": f"Bearer {gym_admin_token()}"})
        assert ledger.status_code == 200, ledger.text
        assert "reserved" not in {e.get("status") for e in ledger.json()["data"]}
    service.holder.close()


def _key_id(client: Any, key: str) -> str:
    return str(client.get("/v1/key", headers=bearer(key)).json()["id"])


def gym_admin_token() -> str:
    from tests.conftest import ADMIN_TOKEN

    return ADMIN_TOKEN


def test_data_track_refuses_another_learning_rate(served: tuple[Any, str]) -> None:
    gym, url = served
    with client_for(gym) as admin:
        key = create_key(admin, budget_usd=5.0, track="data")["key"]
    trainer = _service(url, key).create_lora_training_client(base_model="tiny", rank=16, seed=0).result()
    trainer.forward_backward([_datum(PROMPT)], "cross_entropy").result()
    with pytest.raises(tinker.PermissionDeniedError) as err:
        trainer.optim_step(types.AdamParams(learning_rate=0.5)).result()
    assert "learning_rate" in str(err.value)
    trainer.optim_step(types.AdamParams(learning_rate=0.001)).result()  # the fixed one is accepted
    with pytest.raises(tinker.PermissionDeniedError):
        _service(url, key).create_lora_training_client(base_model="tiny", rank=4).result()


def test_budget_exhaustion_fails_closed(served: tuple[Any, str]) -> None:
    gym, url = served
    with client_for(gym) as admin:
        key = create_key(admin, budget_usd=0.004, track="joint")["key"]  # two forward_backwards
    trainer = _service(url, key).create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    long = list(range(3, 200))
    state = None
    with pytest.raises(tinker.BillingError):
        for _ in range(50):
            trainer.forward_backward([_datum(long)] * 4, "cross_entropy").result()
            trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            state = trainer.save_state("last").result().path
    assert state is not None
    trainer.load_state(state).result()  # the last saved state is kept
    with client_for(gym) as client:
        ledger = client.get(f"/admin/v1/keys/{_key_id(client, key)}/ledger",
                            headers={"Authorization": f"Bearer {gym_admin_token()}"})
        assert "reserved" not in {e.get("status") for e in ledger.json()["data"]}


def test_bare_run_key_and_unknown_route(served: tuple[Any, str]) -> None:
    gym, url = served
    with client_for(gym) as admin:
        key = create_key(admin, budget_usd=1.0, track="joint")["key"]
    for presented in (key, "tml-" + key):
        r = httpx.post(f"{url}/tinker/api/v1/create_session", headers={"X-API-Key": presented},
                       json={"tags": [], "user_metadata": {}, "sdk_version": "0.38.0"})
        assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/tinker/api/v1/auth/token", headers={"X-API-Key": "tml-" + key}, json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    assert httpx.post(f"{url}/tinker/api/v1/create_session", headers={"X-API-Key": "tml-nope"}).status_code == 401


def test_another_runs_key_reaches_nothing_of_a_runs_loop(served: tuple[Any, str]) -> None:
    """An attacker holding another run's key (as `tml-` or bare, or a forged run header) sees a
    run's training model, saved state and futures as missing: 404, nothing loaded, nothing charged."""
    gym, url = served
    with client_for(gym) as admin:
        victim = create_key(admin, budget_usd=5.0, track="joint")["key"]
        attacker = create_key(admin, budget_usd=5.0, track="joint")
    service = _service(url, victim)
    trainer = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    state = trainer.save_state("s").result().path
    model_id = trainer.model_id
    pending = httpx.post(f"{url}/tinker/api/v1/optim_step", headers={"X-API-Key": "tml-" + victim},
                         json={"model_id": model_id, "adam_params": {"learning_rate": 1e-3}}).json()
    for header in ({"X-API-Key": "tml-" + attacker["key"]}, {"X-API-Key": attacker["key"],
                                                            "X-RSIGym-Run": model_id, "X-RSIGym-Key": victim}):
        api = f"{url}/tinker/api/v1"
        for path, body in (("get_info", {"model_id": model_id}),
                           ("optim_step", {"model_id": model_id, "adam_params": {"learning_rate": 1e-3}}),
                           ("retrieve_future", {"request_id": pending["request_id"]}),
                           ("load_weights", {"model_id": None, "path": state, "session_id": "x"})):
            r = httpx.post(f"{api}/{path}", headers=header, json=body, timeout=30)
            assert r.status_code == 404, (path, r.status_code, r.text)
    with client_for(gym) as admin:
        ledger = admin.get(f"/admin/v1/keys/{attacker['id']}/ledger", headers=admin_headers()).json()["data"]
    assert [row for row in ledger if row["status"] != "released"] == []
