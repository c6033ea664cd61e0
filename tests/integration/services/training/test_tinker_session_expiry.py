"""Tinker sessions whose heartbeats stop are expired (services/training/tinker_api/sessions.py):
with ``RSIGYM_TINKER_SESSION_TTL_S=1`` the unmodified SDK trains in two sessions, then one of them
falls silent. It is ended as ``ServiceClient.close()`` would end it — its model closed, its job row
finished, its loop data registered as a ``loop`` dataset, no hold left ``reserved`` — and a call on
its model is refused with 410 ``session_ended`` saying why; the session that keeps beating goes on.

The SDK beats every 10 s, longer than the test's TTL: its own heartbeat loop is stopped and the
test beats for the sessions it keeps alive (``POST session_heartbeat``, as the SDK does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from services.records.events import RecordEvent
from services.training.tables import TrainingJob
from tests.conftest import ADMIN_TOKEN, client_for, create_key
from tests.fakes.servers import serve_gym

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
INPUTS: dict[str, Any] = {"target_tokens": PROMPT[1:], "weights": [1.0] * (len(PROMPT) - 1)}
DATUM = types.Datum(model_input=types.ModelInput.from_ints(PROMPT[:-1]), loss_fn_inputs=INPUTS)


@pytest.fixture
def served(make_gym: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("RSIGYM_TINKER_SESSION_TTL_S", "1")  # the reaper looks every 0.25 s
    gym = make_gym()
    with serve_gym(gym) as url:
        yield gym, url


class Beats:
    """Heartbeats every 0.2 s for the sessions in ``alive``, as the SDK's loop sends them."""

    def __init__(self, url: str, key: str):
        self.url, self.key = url, key
        self.alive: set[str] = set()
        self.refused: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=f"{self.url}/tinker/api/v1", headers={"X-API-Key": "tml-" + self.key},
                          timeout=10) as client:
            while not self._stop.wait(0.2):
                for session_id in list(self.alive):
                    r = client.post("/session_heartbeat", json={"session_id": session_id})
                    if r.status_code != 200:
                        self.refused[session_id] = r.status_code

    def __enter__(self) -> Beats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _service(url: str, key: str, beats: Beats) -> tuple[Any, str]:
    """A ServiceClient whose session the test keeps alive (its own 10 s heartbeat loop stopped)."""
    service = tinker.ServiceClient(base_url=f"{url}/tinker", api_key="tml-" + key)
    holder = service.holder
    session_id = holder.get_session_id()
    beats.alive.add(session_id)

    async def stop_heartbeats() -> None:
        task = holder._session_heartbeat_task
        assert task is not None
        task.cancel()

    holder.run_coroutine_threadsafe(stop_heartbeats()).result()
    return service, session_id


def _job(gym: Any, job_id: str) -> Any:
    with gym.gateway.store.transaction() as s:
        return s.scalar(select(TrainingJob).where(TrainingJob.id == job_id))


def test_silent_session_expires_and_a_beating_one_goes_on(served: tuple[Any, str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    gym, url = served
    tinker_api = gym.service_apps["training"].state.tinker
    assert tinker_api.session_ttl_s == 1.0  # read from RSIGYM_TINKER_SESSION_TTL_S
    with client_for(gym) as admin:
        key = create_key(admin, budget_usd=5.0, track="joint")
    with Beats(url, key["key"]) as beats:
        silent, silent_id = _service(url, key["key"], beats)
        kept, kept_id = _service(url, key["key"], beats)
        trainer = silent.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
        trainer.forward_backward([DATUM], "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        other = kept.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
        other.forward([DATUM], "cross_entropy").result()
        model_id = trainer.model_id
        assert _job(gym, model_id).status == "interactive"

        caplog.set_level("INFO", logger="rsigym.training.tinker")
        beats.alive.discard(silent_id)  # the silent part: no heartbeat, no call
        deadline = time.monotonic() + 10
        while _job(gym, model_id).status == "interactive":
            assert time.monotonic() < deadline, "the silent session was not expired"
            time.sleep(0.1)
        silent_at = time.monotonic()
        while time.monotonic() - silent_at < 1.5:  # the beating session outlives the TTL
            time.sleep(0.1)

        # its model is closed: a call on it is refused with a clear error, nothing is queued
        with pytest.raises(tinker.APIStatusError) as refused:
            trainer.forward([DATUM], "cross_entropy").result()
        assert refused.value.status_code == 410
        body = refused.value.body
        assert isinstance(body, dict) and body["error"]["type"] == "session_ended", body
        assert f"{silent_id} expired" in body["error"]["message"], body
        assert "RSIGYM_TINKER_SESSION_TTL_S" in body["error"]["message"]
        heartbeat = httpx.post(f"{url}/tinker/api/v1/session_heartbeat", json={"session_id": silent_id},
                               headers={"X-API-Key": "tml-" + key["key"]})
        assert heartbeat.status_code == 410, heartbeat.text  # the SDK's heartbeat loop stops on 410

        # the session that kept beating is open, and its model trains on
        assert kept_id not in beats.refused and silent_id not in beats.refused
        other.forward_backward([DATUM], "cross_entropy").result()
        assert _job(gym, other.model_id).status == "interactive"

    assert any(silent_id in r.getMessage() and "expired" in r.getMessage() for r in caplog.records)
    job = _job(gym, model_id)
    assert job.status == "succeeded" and job.step == 1 and job.dataset_ids
    with gym.gateway.store.transaction() as s:
        events = [(e.kind, e.data) for e in s.scalars(select(RecordEvent).where(RecordEvent.run_id == key["id"])
                                                        .order_by(RecordEvent.seq))]
    loops = [d for k, d in events if k == "dataset.registered" and d["format"] == "loop" and model_id in d["name"]]
    assert [d["dataset_id"] for d in loops] == job.dataset_ids
    last = [d for k, d in events if k == "training.job" and d["job_id"] == model_id][-1]
    assert last["status"] == "succeeded" and [d["id"] for d in last["datasets"]] == job.dataset_ids

    kept.close("success").result()  # the finish of a live session, as before
    assert _job(gym, other.model_id).status == "succeeded"
    with client_for(gym) as client:
        ledger = client.get(f"/admin/v1/keys/{key['id']}/ledger", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert ledger.status_code == 200, ledger.text
        assert ledger.json()["data"] and "reserved" not in {e.get("status") for e in ledger.json()["data"]}
    silent.holder.close()
