"""The job lifecycle (services/core/jobs.py) on SQLite and PostgreSQL: one claim per job, finish
once, a dead worker's job reaped with its ledger holds released, an evaluation resumed without
re-running recorded trials, and the queue figures the gateway exports."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from bench.eval_scaling import run_job
from services.core.config import GymConfig
from services.core.ids import new_id
from services.core.jobs import JobRunnerBase, PoolDispatcher, queue_figures
from services.core.keys import KeyRegistry
from services.core.ledger import Ledger
from services.core.money import usd_to_nusd
from services.core.presets import preset_policy
from services.core.settings import GymSettings, JobSettings, ProviderSecrets
from services.core.spec import ServiceContext
from services.core.store import Store
from services.core.tables import ApiKey, LedgerEntry, utcnow
from services.evaluation.harnesses import HarnessStore
from services.evaluation.jobs import EvaluationRunner
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.schemas import MINIMAL
from services.evaluation.tables import EvaluationJob, TrialClaim, TrialResultRow
from services.evaluation.trials import TrialOutcome, TrialRequest
from services.training.tables import TrainingJob
from tests.fakes.live_gym import mini_benchmark


class Recorder:
    """A dispatcher that only notes what was sent (the test runs jobs itself)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    def dispatch(self, runner: JobRunnerBase, job_id: str, queue: str, task: str) -> None:
        self.sent.append((job_id, queue, task))

    def shutdown(self) -> None:
        pass


class CountingTrial:
    def __init__(self) -> None:
        self.ran: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    async def __call__(self, req: TrialRequest) -> TrialOutcome:
        with self.lock:
            self.ran.append((req.task.id, req.attempt))
        now = utcnow().isoformat()
        return TrialOutcome(task_id=req.task.id, attempt=req.attempt, reward=1.0, trajectory=None, verifier_output="",
                            agent_output="", error=None, sandbox_id=None, started_at=now, finished_at=now,
                            result_path=None)


def _key(store: Store, usd: float = 1.0) -> str:
    view, _ = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=usd_to_nusd(usd), track="joint")
    return str(view["id"])


def _evaluation(store: Store, tmp_path: Path, trial: Any, dispatcher: Any = None, **settings: Any) -> tuple[EvaluationRunner, str]:
    registry = BenchmarkRegistry(store, tmp_path / "benchmarks")
    row, bench = registry.register(mini_benchmark(tmp_path / "src"))
    task_ids = [t.id for _split, t in bench.tasks()]
    key_id = _key(store)
    job_id = new_id("evj")
    with store.transaction() as s:
        s.add(EvaluationJob(id=job_id, run_id=key_id, key_id=key_id, purpose="agent", benchmark=row.name, split="*",
                            model="tiny", harness=MINIMAL, attempts=2, sampling={}, task_ids=task_ids, gateway_url="",
                            trials_total=len(task_ids) * 2))
    runner = EvaluationRunner(store, registry, HarnessStore(store, tmp_path / "harnesses"), tmp_path / "trials",
                              runner=trial, gateway_url=lambda: "http://127.0.0.1:9",
                              dispatcher=dispatcher or Recorder(), job_settings=JobSettings(**settings))
    return runner, job_id


def _status(store: Store, table: Any, job_id: str) -> tuple[str, str | None, str | None]:
    with store.transaction() as s:
        row = s.execute(select(table.status, table.worker, table.error).where(table.id == job_id)).one()
        return row[0], row[1], row[2]


def test_a_job_is_claimed_once_and_finished_once(store: Store, tmp_path: Path) -> None:
    trial = CountingTrial()
    a, job_id = _evaluation(store, tmp_path, trial)
    b = EvaluationRunner(store, a.registry, a.harnesses, tmp_path / "trials", runner=trial, dispatcher=Recorder())
    barrier = threading.Barrier(8)
    claims: list[Any] = []

    def race(runner: EvaluationRunner) -> None:
        barrier.wait()
        claims.append(runner.claim(job_id))

    threads = [threading.Thread(target=race, args=(r,)) for r in [a, b] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [c for c in claims if c is not None]
    assert len(winners) == 1
    status, worker, _ = _status(store, EvaluationJob, job_id)
    assert status == "running" and worker in (a.worker_id, b.worker_id)
    owner, other = (a, b) if worker == a.worker_id else (b, a)
    assert other._finish(job_id, "failed", "not mine") is False  # another worker cannot end it
    assert owner._finish(job_id, "succeeded", None) is True
    assert owner._finish(job_id, "failed", "late") is False  # final states are never overwritten
    assert _status(store, EvaluationJob, job_id)[0] == "succeeded"
    assert other.execute(job_id) is False and trial.ran == []  # a redelivered task for a final job does nothing


def test_a_task_for_a_job_alive_elsewhere_does_nothing(store: Store, tmp_path: Path) -> None:
    trial = CountingTrial()
    runner, job_id = _evaluation(store, tmp_path, trial)
    with store.transaction() as s:
        s.execute(update(EvaluationJob).where(EvaluationJob.id == job_id).values(
            status="running", worker="elsewhere:1:abc", heartbeat_at=utcnow()))
    assert runner.execute(job_id) is False
    assert trial.ran == [] and _status(store, EvaluationJob, job_id)[:2] == ("running", "elsewhere:1:abc")


def test_a_dead_workers_training_job_fails_and_its_holds_are_released(store: Store, tmp_path: Path) -> None:
    from services.training.service import TrainingService

    key_id = _key(store)
    context = ServiceContext(config=GymConfig(), store=store, settings=GymSettings(data_dir=tmp_path),
                             internal_secret="x", secrets=ProviderSecrets({}))
    runner = TrainingService(context).runner
    runner.dispatcher.shutdown()
    runner.dispatcher = Recorder()
    dead, alive = new_id("ftjob"), new_id("ftjob")
    with store.transaction() as s:
        for job_id, beat in ((dead, utcnow() - timedelta(minutes=5)), (alive, utcnow())):
            s.add(TrainingJob(id=job_id, run_id=key_id, key_id=key_id, status="running", base_model="tiny",
                              dataset_ids=[], config={}, config_hash="0" * 64, total_steps=10, worker="w:1:x",
                              heartbeat_at=beat, claims=1))
    ledger = Ledger(store)
    held = [ledger.reserve(key_id, service="training", operation="train_step", estimate_nusd=1000, ref_id=j)
            for j in (dead, alive)]
    assert runner.reap_stale() == 1
    assert _status(store, TrainingJob, dead)[0] == "failed"
    assert _status(store, TrainingJob, alive)[0] == "running"  # its worker still beats
    with store.transaction() as s:
        states = dict(s.execute(select(LedgerEntry.ref_id, LedgerEntry.status)).all())
        key = s.get(ApiKey, key_id)
        assert key is not None
        assert states == {dead: "released", alive: "reserved"}
        assert (key.reserved_nusd, key.spent_nusd) == (held[1].estimate_nusd, 0)
    assert runner.reap_stale() == 0  # reaped once


def test_a_dead_workers_evaluation_resumes_and_skips_recorded_trials(store: Store, tmp_path: Path) -> None:
    trial = CountingTrial()
    runner, job_id = _evaluation(store, tmp_path, trial, dispatcher=PoolDispatcher(1, "test-eval"))
    with store.transaction() as s:
        job = s.get(EvaluationJob, job_id)
        assert job is not None
        first = job.task_ids[0]
        s.execute(update(EvaluationJob).where(EvaluationJob.id == job_id).values(
            status="running", worker="dead:1:x", heartbeat_at=utcnow() - timedelta(minutes=5), claims=1,
            started_at=utcnow()))
        s.add(TrialResultRow(job_id=job_id, task_id=first, attempt=1, reward=0.0, error=None, trajectory=None))
        total = job.trials_total
    # The dead worker had minted keys for its trials: they must not outlive it.
    minted, _ = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=None, parent_id=job.key_id,
                                          name=f"evaluation {job_id} sandboxes")
    try:
        runner.recover()  # embedded: this process was the only worker
        assert runner.wait_idle(timeout=60)
    finally:
        runner.shutdown()
    assert (first, 1) not in trial.ran and len(trial.ran) == total - 1 == len(set(trial.ran))
    with store.transaction() as s:
        job = s.get(EvaluationJob, job_id)
        assert job is not None and job.status == "succeeded" and job.claims == 2
        rows = s.scalars(select(TrialResultRow).where(TrialResultRow.job_id == job_id)).all()
        assert len(rows) == total
        # first task: 0 then 1 → 0.5; the other three tasks 1.0 → mean 0.875
        assert job.score == pytest.approx((0.5 + 3 * 1.0) / 4)
        assert s.scalar(select(ApiKey.status).where(ApiKey.id == minted["id"])) == "revoked"


def test_a_job_that_keeps_killing_its_workers_is_failed_not_resumed_forever(store: Store, tmp_path: Path) -> None:
    recorder = Recorder()
    runner, job_id = _evaluation(store, tmp_path, CountingTrial(), dispatcher=recorder, max_resumes=1)
    for round_ in (1, 2):
        with store.transaction() as s:
            s.execute(update(EvaluationJob).where(EvaluationJob.id == job_id).values(
                status="running", worker=f"dead:{round_}", heartbeat_at=utcnow() - timedelta(minutes=5),
                claims=round_))
        assert runner.reap_stale() == 1
    assert [j for j, _, _ in recorder.sent] == [job_id]  # re-queued (and re-sent) once, then failed
    assert _status(store, EvaluationJob, job_id)[::2] == ("failed", "its worker stopped (no heartbeat)")


def test_a_cancelled_queued_job_is_cancelled_by_its_task(store: Store, tmp_path: Path) -> None:
    trial = CountingTrial()
    runner, job_id = _evaluation(store, tmp_path, trial)
    with store.transaction() as s:
        s.execute(update(EvaluationJob).where(EvaluationJob.id == job_id).values(cancel_requested=True))
    assert runner.execute(job_id) is False
    assert _status(store, EvaluationJob, job_id)[0] == "cancelled" and trial.ran == []


def test_submit_routes_by_purpose_and_queue(store: Store, tmp_path: Path) -> None:
    recorder = Recorder()
    runner, job_id = _evaluation(store, tmp_path, CountingTrial(), dispatcher=recorder)
    runner.submit(job_id)
    with store.transaction() as s:
        s.execute(update(EvaluationJob).where(EvaluationJob.id == job_id).values(purpose="validation",
                                                                                dispatched_at=None))
    runner.submit(job_id)  # (sent once: a job already handed out is not sent again)
    assert recorder.sent == [(job_id, "evaluation", "rsigym.evaluation.run"),
                             (job_id, "evaluation", "rsigym.evaluation.validation")]
    figures = queue_figures(store, [EvaluationJob, TrainingJob])
    assert figures["evaluation"][0] == 1 and figures["training"] == (0, 0.0) and figures["training-gpu"] == (0, 0.0)


def test_two_workers_share_a_jobs_trials_and_a_dead_helpers_trial_is_rerun(store: Store, tmp_path: Path) -> None:
    b_ran = threading.Event()

    class Lane(CountingTrial):
        def __init__(self, waits: bool):
            super().__init__()
            self.waits = waits

        async def __call__(self, req: TrialRequest) -> TrialOutcome:
            if self.waits:  # the owner holds its first trial until the helper has run one: both must work
                assert await asyncio.to_thread(b_ran.wait, 30)
            outcome = await super().__call__(req)
            if not self.waits:
                b_ran.set()
            return outcome

    owner_trial, helper_trial = Lane(waits=True), Lane(waits=False)
    fast = {"heartbeat_interval_s": 0.2, "heartbeat_ttl_s": 1.0}
    owner, job_id = _evaluation(store, tmp_path, owner_trial, **fast)
    helper = EvaluationRunner(store, owner.registry, owner.harnesses, tmp_path / "trials", runner=helper_trial,
                              gateway_url=lambda: "http://127.0.0.1:9", dispatcher=Recorder(),
                              job_settings=JobSettings(**fast))
    with store.transaction() as s:
        job = s.get(EvaluationJob, job_id)
        assert job is not None
        orphan = (job.task_ids[-1], 2)  # a helper that died holding this trial
        s.add(TrialClaim(job_id=job_id, task_id=orphan[0], attempt=orphan[1], worker="dead:9:x",
                         heartbeat_at=utcnow() - timedelta(minutes=5)))
        total = job.trials_total
    owner.trial_concurrency = helper.trial_concurrency = 1
    t_owner = threading.Thread(target=owner.execute, args=(job_id,))
    t_owner.start()
    for _ in range(200):  # the helper comes once the owner holds the job
        if _status(store, EvaluationJob, job_id)[0] == "running":
            break
        time.sleep(0.05)
    t_helper = threading.Thread(target=helper.assist, args=(job_id,))
    t_helper.start()
    t_owner.join(timeout=60)
    t_helper.join(timeout=60)
    ran = owner_trial.ran + helper_trial.ran
    assert owner_trial.ran and helper_trial.ran  # both workers ran trials of the one job
    assert len(ran) == len(set(ran)) == total and orphan in ran  # each once, the dead helper's trial too
    with store.transaction() as s:
        job = s.get(EvaluationJob, job_id)
        assert job is not None and job.status == "succeeded" and job.trials_done == total
        assert s.scalar(select(func.count()).select_from(TrialClaim)) == 0
        assert s.scalar(select(func.count()).select_from(TrialResultRow).where(TrialResultRow.job_id == job_id)) == total


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_eval_scaling_bench_code_path_records_every_trial_once(store: Store, tmp_path: Path) -> None:
    """bench/eval_scaling.py at a tiny size — two worker processes sharing one job: correctness
    only (the bench prints the speed-up)."""
    out = run_job(store, tmp_path, tasks_per_split=2, attempts=2, workers=2, delay_s=0.0)
    assert (out.status, out.trials, out.distinct, sum(out.runner_calls)) == ("succeeded", 8, 8, 8)
    assert out.score == 0.5  # attempt 1 prints 1, attempt 2 prints 0 — from a real sandboxed command


def test_gateway_metrics_report_queue_depth_age_and_finished_jobs(make_gym: Any) -> None:
    from tests.conftest import admin_headers, client_for

    gym = make_gym()
    store = gym.gateway.store
    key_id = _key(store)
    with store.transaction() as s:  # rows as the services write them (nothing submits them here)
        s.add(TrainingJob(id=new_id("ftjob"), run_id=key_id, key_id=key_id, status="queued", base_model="big",
                          dataset_ids=[], config={}, config_hash="0" * 64, total_steps=10, queue="training-gpu",
                          created_at=utcnow() - timedelta(seconds=120)))
        for status in ("failed", "failed", "succeeded"):
            s.add(EvaluationJob(id=new_id("evj"), run_id=key_id, key_id=key_id, benchmark="b", split="dev",
                                model="tiny", harness=MINIMAL, attempts=1, task_ids=[], gateway_url="",
                                trials_total=0, status=status))
    client = client_for(gym)
    text = client.get("/metrics", headers=admin_headers()).text
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith(("rsigym_queue", "rsigym_jobs_finished_total"))}
    assert lines['rsigym_queue_depth{queue="training-gpu"}'] == 1
    assert lines['rsigym_queue_depth{queue="training"}'] == lines['rsigym_queue_depth{queue="evaluation"}'] == 0
    assert 120 <= lines['rsigym_queue_oldest_age_seconds{queue="training-gpu"}'] < 3600
    assert lines['rsigym_jobs_finished_total{kind="evaluation",status="failed"}'] == 2
    assert lines['rsigym_jobs_finished_total{kind="evaluation",status="succeeded"}'] == 1
    assert client.get("/metrics").status_code == 401  # still admin-only


def test_queues_by_role() -> None:
    from services.core.config import BaseModel_
    from services.training.jobs import queue_for
    from services.worker.main import parse_queues

    prices = {"train_usd_per_mtok": 1.0, "prefill_usd_per_mtok": 1.0, "sample_usd_per_mtok": 1.0}
    assert queue_for(BaseModel_(name="qwen", backend="vllm", vllm_url="http://gpu:8000", **prices)) == "training-gpu"
    assert queue_for(BaseModel_(name="tiny", **prices)) == "training"
    assert parse_queues("training-gpu, evaluation") == ["training-gpu", "evaluation"]
    with pytest.raises(SystemExit, match="unknown: gpu"):
        parse_queues("training,gpu")
