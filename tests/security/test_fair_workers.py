"""Shared workers cannot be monopolised (issue 13, item 4).

A run that queues many jobs, or whose custom loss sleeps, must not hold the gym's workers for
free or ahead of everyone: jobs wait in a fair queue (round-robin across runs, a per-run cap
on running jobs enforced when a worker claims a job, whatever sent it), a custom loss's wall
time is billed per second and cut at a per-step cap, and an owner sees its job's place in the
queue and how long it waited. Embedded gyms train the tiny model for real; the Celery side's
scheduler is driven directly on SQLite and PostgreSQL with a dispatcher that records what it
would publish.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

import rsigym
from jobs.lifecycle import JobRunnerBase
from kit.ids import new_id
from kit.settings import JobSettings
from services.training.tables import TrainingJob
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry, utcnow
from tests.conftest import create_key, gym_config
from tests.fakes.servers import serve_gym

ROWS = [{"messages": [{"role": "user", "content": "Repeat: red lion"},
                      {"role": "assistant", "content": "red lion"}]}] * 16
SLEEPING_LOSS = """
import time
def loss(logits, labels, mask):
    time.sleep(%s)
    return (logits * 0).sum()
"""
USD_PER_S = 0.01  # the custom-loss price in these gyms: 36 USD/h
CAP_S = 8.0  # the per-step cap on a custom loss's wall time where a loss is to be cut
ROOMY_CAP_S = 120.0  # elsewhere: a sandboxed loss needs seconds to start on a busy 2-core host
SMALL = {"base_model": "tiny", "steps": 1, "batch_size": 8, "max_length": 64}


def _gym(make_gym: Any, standin: Any, workers: int, cap_s: float = ROOMY_CAP_S) -> Any:
    config = gym_config(standin[0])
    config.training = config.training.model_copy(update={
        "workers": workers, "max_running_per_run": 1, "custom_loss_timeout_s": cap_s,
        "custom_loss_usd_per_hour": USD_PER_S * 3600})
    return make_gym(config=config)


@pytest.fixture
def served(make_gym: Any, standin: Any) -> Iterator[Any]:
    """Serve a gym with ``workers`` training workers and a custom-loss cap: (url, admin http, gym)."""
    if shutil.which("bwrap") is None:
        pytest.skip("custom losses need bubblewrap")
    with contextlib.ExitStack() as stack:
        def serve(workers: int, cap_s: float = ROOMY_CAP_S) -> tuple[str, httpx.Client, Any]:
            gym = _gym(make_gym, standin, workers, cap_s)
            url = stack.enter_context(serve_gym(gym))
            return url, stack.enter_context(httpx.Client(base_url=url, timeout=120)), gym

        yield serve


def _agent(url: str, http: httpx.Client) -> tuple[rsigym.Gym, str]:
    key = create_key(http, 5.0)
    return rsigym.Gym(base_url=url, api_key=key["key"], timeout=120), str(key["id"])


def _t(value: Any) -> datetime:
    return datetime.fromisoformat(str(value))


def _running(agent: rsigym.Gym, job_id: str) -> None:
    """Wait until a worker has taken the job (it is then off the queue)."""
    deadline = time.monotonic() + 120
    while agent.training.get_job(job_id).status == "queued":
        assert time.monotonic() < deadline, "the job was never taken"
        time.sleep(0.05)


def test_one_worker_serves_runs_in_turn_and_bills_a_losss_seconds(served: Any) -> None:
    url, http, _ = served(workers=1)
    a, _ = _agent(url, http)
    b, _ = _agent(url, http)
    ds_a, ds_b = a.training.upload_dataset(ROWS), b.training.upload_dataset(ROWS)
    # Run A queues three jobs (the first's loss sleeps: it holds the only worker a while), then B one.
    a1 = a.training.create_job(datasets=[ds_a.id], loss="custom", custom_loss=SLEEPING_LOSS % 1.0, **SMALL)
    a2 = a.training.create_job(datasets=[ds_a.id], **SMALL)
    a3 = a.training.create_job(datasets=[ds_a.id], **SMALL)
    b1 = b.training.create_job(datasets=[ds_b.id], **SMALL)
    _running(a, a1.id)

    # While A's first job holds the worker, B's job is next, A's third last; A3's place only shrinks.
    first_a3, first_b1 = a.training.get_job(a3.id), b.training.get_job(b1.id)
    assert first_b1.status == "queued" and first_b1.queue_position == 1, first_b1
    assert first_a3.status == "queued" and first_a3.queue_position == 3, first_a3
    assert first_a3.queued_s is not None and first_a3.queued_s >= 0
    positions = [first_a3.queue_position]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        view = a.training.get_job(a3.id)
        if view.status != "queued":
            break
        positions.append(view.queue_position)
        time.sleep(0.1)
    assert positions == sorted(positions, reverse=True) and positions[-1] < positions[0], positions

    done = {j.id: c.training.wait(j.id, timeout=240, poll=0.2) for c, j in ((a, a1), (a, a2), (a, a3), (b, b1))}
    assert all(j.status == "succeeded" for j in done.values()), [(j.status, j.error) for j in done.values()]
    started = {job_id: _t(j.started_at) for job_id, j in done.items()}
    assert started[b1.id] < started[a2.id] < started[a3.id], started  # round-robin, not first-come
    assert done[a3.id].queue_position is None and (done[a3.id].queued_s or 0) > 0

    # The sleeping loss's seconds were billed at the per-second price, on top of the tokens.
    metrics = (done[a1.id].metrics or [])[0]
    assert metrics.loss_s is not None and 1.0 <= metrics.loss_s <= ROOMY_CAP_S, metrics
    assert metrics.cost_usd >= metrics.loss_s * USD_PER_S, metrics
    plain = (done[a2.id].metrics or [])[0]
    assert plain.loss_s is None and plain.cost_usd < 0.001


def test_a_loss_that_sleeps_past_the_cap_is_cut_and_billed_for_it(served: Any) -> None:
    url, http, gym = served(workers=1, cap_s=CAP_S)
    c, c_key = _agent(url, http)
    ds_c = c.training.upload_dataset(ROWS)
    cut = c.training.wait(c.training.create_job(datasets=[ds_c.id], loss="custom", custom_loss=SLEEPING_LOSS % 600,
                                                **SMALL).id, timeout=240, poll=0.2)
    assert cut.status == "failed" and cut.step == 0, (cut.status, cut.error)
    assert f"per-step cap of {CAP_S:g} s" in (cut.error or ""), cut.error
    store = gym.gateway.context.store
    with store.transaction() as s:
        entries = s.execute(select(LedgerEntry.status, LedgerEntry.actual_nusd).where(LedgerEntry.ref_id == cut.id)).all()
        key = s.get(ApiKey, c_key)
        assert key is not None
        spent, reserved = key.spent_nusd, key.reserved_nusd
    cap_nusd = round(CAP_S * USD_PER_S * 1e9)
    assert [(st, n) for st, n in entries] == [("settled", cap_nusd)], entries
    assert spent == cap_nusd and reserved == 0 and cut.cost_usd == pytest.approx(CAP_S * USD_PER_S)
    assert c.balance().spent_usd == pytest.approx(CAP_S * USD_PER_S)


def test_a_runs_cap_holds_in_the_queue_while_other_runs_use_the_free_worker(served: Any) -> None:
    url, http, _ = served(workers=2)
    a, _ = _agent(url, http)
    b, _ = _agent(url, http)
    ds_a, ds_b = a.training.upload_dataset(ROWS), b.training.upload_dataset(ROWS)
    # The HTTP layer accepts both of A's jobs; two workers are free; A's cap is one job at a time.
    a1 = a.training.create_job(datasets=[ds_a.id], loss="custom", custom_loss=SLEEPING_LOSS % 2.0, **SMALL)
    a2 = a.training.create_job(datasets=[ds_a.id], **SMALL)
    _running(a, a1.id)
    waiting = a.training.get_job(a2.id)
    assert waiting.status == "queued" and waiting.queue_position == 1, waiting
    b1 = b.training.create_job(datasets=[ds_b.id], **SMALL)  # the free worker is B's at once
    done = {j.id: c.training.wait(j.id, timeout=240, poll=0.2) for c, j in ((a, a1), (a, a2), (b, b1))}
    assert all(j.status == "succeeded" for j in done.values()), [(j.status, j.error) for j in done.values()]
    assert _t(done[a2.id].started_at) >= _t(done[a1.id].finished_at)  # never two of A's at once
    assert _t(done[b1.id].started_at) < _t(done[a1.id].finished_at)  # B was not held up by A's queue


# -- the scheduler itself, as a Celery service and workers drive it ------------------------------

class Recorder:
    """Stands for the Celery dispatcher: notes what would be published (no free() — the workers
    are elsewhere, so at most ``publish_ahead`` jobs per queue wait in the broker)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def dispatch(self, runner: JobRunnerBase, job_id: str, queue: str, task: str) -> None:
        self.sent.append(job_id)

    def shutdown(self) -> None:
        pass


class Runner(JobRunnerBase):
    table = TrainingJob
    kind = "training"
    final = frozenset({"succeeded", "failed", "cancelled"})

    def _run(self, job: Any) -> None:
        self._finish(job.id, "succeeded", None)


def _job(store: Store, run: str, n: int) -> str:
    job_id = new_id("ftjob")
    with store.transaction() as s:
        s.add(TrainingJob(id=job_id, run_id=run, key_id=run, status="queued", base_model="tiny", dataset_ids=[],
                          config={}, config_hash="x", total_steps=1, queue="training",
                          created_at=utcnow() + timedelta(milliseconds=n), queued_at=utcnow() + timedelta(milliseconds=n)))
    return job_id


def test_celery_side_publishes_in_turn_and_a_claim_beyond_the_cap_is_refused(store: Store) -> None:
    recorder = Recorder()
    runner = Runner(store, workers=1, name="t", dispatcher=recorder, settings=JobSettings(publish_ahead=1),
                    max_running_per_run=1)
    a1, a2, a3 = (_job(store, "run_a", i) for i in range(3))
    for job_id in (a1, a2, a3):
        runner.submit(job_id)
    b1 = _job(store, "run_b", 3)
    runner.submit(b1)
    assert recorder.sent == [a1]  # one waits in the broker; the rest wait their turn in the store
    assert runner.claim(a1) is not None  # a worker takes A1 and pumps (as execute does): B's goes out
    runner.pump()
    assert recorder.sent == [a1, b1]
    # A task for A's next job arriving anyway (a stale or forged one) is refused while A1 runs.
    assert runner.claim(a2) is None and runner.claim(a3) is None
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(TrainingJob).where(
            TrainingJob.run_id == "run_a", TrainingJob.status == "running")) == 1
    assert runner.claim(b1) is not None
    runner.pump()
    assert recorder.sent == [a1, b1]  # A is at its cap: nothing of A's is published
    runner._finish(a1, "succeeded", None)
    runner.pump()
    assert recorder.sent == [a1, b1, a2]


def test_two_workers_racing_for_one_runs_last_slot_get_it_once(store: Store) -> None:
    runner = Runner(store, workers=1, name="t", dispatcher=Recorder(), max_running_per_run=1)
    others = [Runner(store, workers=1, name="t", dispatcher=Recorder(), max_running_per_run=1) for _ in range(5)]
    jobs = [_job(store, "run_a", i) for i in range(6)]
    barrier = threading.Barrier(6)
    won: list[Any] = []

    def race(r: Runner, job_id: str) -> None:
        barrier.wait()
        won.append(r.claim(job_id))

    threads = [threading.Thread(target=race, args=(r, j)) for r, j in zip([runner, *others], jobs, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([w for w in won if w is not None]) == 1
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(TrainingJob).where(TrainingJob.status == "running")) == 1
