"""The job lifecycle (jobs/lifecycle.py) on SQLite and PostgreSQL: one claim per job, finish
once, a dead worker's job reaped with its ledger holds released, a training job resumed from its
last checkpoint with each step billed once, an evaluation resumed without re-running recorded
trials, and the queue figures the gateway exports."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from access.keys import KeyRegistry
from access.presets import preset_policy
from bench.eval_scaling import run_job
from billing.ledger import Ledger
from billing.money import usd_to_nusd
from jobs.lifecycle import JobRunnerBase, PoolDispatcher, queue_figures
from kit.config import GymConfig
from kit.identity import Identity
from kit.ids import new_id
from kit.settings import GymSettings, JobSettings, ProviderSecrets
from kit.spec import ServiceContext
from services.evaluation.harnesses import HarnessStore
from services.evaluation.jobs import EvaluationRunner
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.schemas import MINIMAL
from services.evaluation.tables import EvaluationJob, TrialClaim, TrialResultRow
from services.evaluation.trials import TrialOutcome, TrialRequest
from services.records.events import TRAINING_JOB, RecordEvent
from services.training.checkpoints import Checkpoint
from services.training.tables import TrainingJob, TrainingStep
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry, utcnow
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


def _training(store: Store, tmp_path: Path) -> tuple[Any, Identity]:
    """The training service of an embedded gym whose jobs the test runs itself (``runner.execute``)."""
    from services.training.service import TrainingService

    context = ServiceContext(config=GymConfig(), store=store, settings=GymSettings(data_dir=tmp_path),
                             internal_secret="x", secrets=ProviderSecrets({}))
    service = TrainingService(context)
    service.runner.dispatcher.shutdown()
    service.runner.dispatcher = Recorder()
    key_id = _key(store, usd=5.0)
    identity = Identity(request_id="req_t", key_id=key_id, run_id=key_id, service="training", operation="jobs",
                        issued_at=time.time())
    return service, identity


def test_a_dead_workers_training_job_is_requeued_then_failed_past_max_resumes(store: Store, tmp_path: Path) -> None:
    service, identity = _training(store, tmp_path)
    runner, key_id = service.runner, identity.key_id
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
    assert _status(store, TrainingJob, dead)[:2] == ("queued", None)  # to be resumed by the next worker
    assert _status(store, TrainingJob, alive)[0] == "running"  # its worker still beats
    with store.transaction() as s:
        states = dict(s.execute(select(LedgerEntry.ref_id, LedgerEntry.status)).all())
        key = s.get(ApiKey, key_id)
        assert key is not None
        assert states == {dead: "released", alive: "reserved"}  # the dead worker's step is not the agent's cost
        assert (key.reserved_nusd, key.spent_nusd) == (held[1].estimate_nusd, 0)
    assert runner.reap_stale() == 0  # reaped once
    max_resumes = runner.job_settings.max_resumes
    with store.transaction() as s:  # its workers keep dying: past max_resumes it fails, saying why
        s.execute(update(TrainingJob).where(TrainingJob.id == dead).values(
            status="running", worker="w:2:y", heartbeat_at=utcnow() - timedelta(minutes=5), claims=max_resumes + 1))
    assert runner.reap_stale() == 1
    status, _, error = _status(store, TrainingJob, dead)
    assert status == "failed" and error == (
        f"its worker stopped (no heartbeat); not resumed again: it was started {max_resumes + 1} times and "
        f"RSIGYM_JOBS_MAX_RESUMES allows {max_resumes} resumes")
    with store.transaction() as s:
        events = s.scalars(select(RecordEvent).where(RecordEvent.kind == TRAINING_JOB)).all()
        assert [(e.data["job_id"], e.data["status"], e.data["resumes"]) for e in events] == [
            (dead, "failed", max_resumes)]


def test_a_dead_workers_training_job_resumes_from_its_checkpoint_and_bills_each_step_once(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker dies after step 6 (checkpoint at 4) in the middle of step 7: the next worker
    continues from the checkpoint — weights, AdamW, schedule, RNG, batch order — so the loss
    curve is the one an uninterrupted job draws; steps 5 and 6 run again unmetered."""
    service, identity = _training(store, tmp_path)
    runner = service.runner
    rows = [{"messages": [{"role": "user", "content": f"What is {i} - 1?"}, {"role": "assistant", "content": str(i - 1)}]}
            for i in range(2, 18)]
    raw = "\n".join(json.dumps(r) for r in rows).encode()
    dataset = service.datasets.upload(run_id=identity.run_id, key_id=identity.key_id, raw=raw, name="minus-one")
    body = {"datasets": [dataset["id"]], "base_model": "tiny", "steps": 12, "batch_size": 2, "max_length": 32,
            "checkpoint_every": 4, "seed": 3, "lora": {"dropout": 0.1}}

    def losses(job_id: str) -> list[float]:
        return [m["loss"] for m in runner.get(job_id, identity.run_id)["metrics"]]

    whole = service.submit(identity, body)["id"]
    assert runner.execute(whole) and runner.get(whole, identity.run_id)["status"] == "succeeded"

    job_id = service.submit(identity, body)["id"]
    alive = runner.should_stop

    def dies_after_step_6(job: str) -> bool:
        with store.transaction() as s:
            step = s.scalar(select(TrainingJob.step).where(TrainingJob.id == job)) or 0
        if step < 6:
            return bool(alive(job))
        with store.transaction() as s:  # kill -9: its heartbeat stops (and it is no longer the job's holder)
            s.execute(update(TrainingJob).where(TrainingJob.id == job).values(
                worker="dead:1:x", heartbeat_at=utcnow() - timedelta(minutes=5)))
        ledger.reserve(identity.key_id, service="training", operation="train_step", estimate_nusd=1234, ref_id=job)
        return True

    ledger = Ledger(store)
    monkeypatch.setattr(runner, "should_stop", dies_after_step_6)
    assert runner.execute(job_id)
    monkeypatch.undo()
    before = runner.get(job_id, identity.run_id)
    assert (before["status"], before["step"], len(before["checkpoints"])) == ("running", 6, 1)  # no step-6 checkpoint
    first_checkpoint = before["checkpoints"][0]
    assert (runner.state_dir / job_id / "step-000004").is_dir()

    assert runner.reap_stale() == 1 and _status(store, TrainingJob, job_id)[0] == "queued"
    assert runner.execute(job_id)
    done = runner.get(job_id, identity.run_id)
    assert (done["status"], done["step"], [m["step"] for m in done["metrics"]]) == ("succeeded", 12, list(range(1, 13)))
    assert losses(job_id) == pytest.approx(losses(whole), rel=1e-4, abs=1e-6)  # continued, not restarted
    log = runner.logs(job_id, identity.run_id)
    assert f"resumed (taken 2 times) from checkpoint {first_checkpoint} at step 4" in log
    assert "steps 5-6 were billed before and are run again unmetered" in log
    with store.transaction() as s:
        ckpts = s.execute(select(Checkpoint.id, Checkpoint.step, Checkpoint.job_id, Checkpoint.parent_checkpoint_id)
                          .where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)).all()
        assert [(c[1], c[2], c[3]) for c in ckpts] == [(4, job_id, None), (8, job_id, None), (12, job_id, None)]
        billed = s.execute(select(LedgerEntry.status, func.count(), func.coalesce(func.sum(LedgerEntry.actual_nusd), 0))
                           .where(LedgerEntry.ref_id == job_id).group_by(LedgerEntry.status)).all()
        step_costs = s.scalar(select(func.sum(TrainingStep.cost_nusd)).where(TrainingStep.job_id == job_id))
        last_cumulative = s.scalar(select(TrainingStep.cumulative_cost_nusd).where(TrainingStep.job_id == job_id,
                                                                                  TrainingStep.step == 12))
        job = s.get(TrainingJob, job_id)
        key = s.get(ApiKey, identity.key_id)
        events = s.scalars(select(RecordEvent).where(RecordEvent.kind == TRAINING_JOB)).all()
    assert job is not None and key is not None
    by_status = {status: (n, int(charged or 0)) for status, n, charged in billed}
    # each of the 12 steps billed once; the hold of step 7 the dead worker was in was released
    assert by_status["settled"] == (12, step_costs) and by_status["released"] == (1, 0) and "reserved" not in by_status
    assert job.cost_nusd == step_costs == last_cumulative
    assert key.reserved_nusd == 0 and key.spent_nusd == 2 * step_costs  # this job and the uninterrupted one
    mine = [e.data for e in events if e.data["job_id"] == job_id]
    assert len(mine) == 1 and mine[0]["status"] == "succeeded" and mine[0]["resumes"] == 1
    assert mine[0]["output_checkpoints"] == [c[0] for c in ckpts] and mine[0]["cost_nusd"] == step_costs
    assert not (runner.state_dir / job_id).exists()  # the resume state goes with the job


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
    assert _status(store, EvaluationJob, job_id)[::2] == ("failed", "its worker stopped (no heartbeat); not resumed "
                                                              "again: it was started 2 times and "
                                                              "RSIGYM_JOBS_MAX_RESUMES allows 1 resumes")


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
    from kit.config import BaseModel_
    from services.training.jobs import queue_for
    from services.worker.main import parse_queues

    prices = {"train_usd_per_mtok": 1.0, "prefill_usd_per_mtok": 1.0, "sample_usd_per_mtok": 1.0}
    assert queue_for(BaseModel_(name="qwen", backend="vllm", vllm_url="http://gpu:8000", **prices)) == "training-gpu"
    assert queue_for(BaseModel_(name="tiny", **prices)) == "training"
    assert parse_queues("training-gpu, evaluation") == ["training-gpu", "evaluation"]
    with pytest.raises(SystemExit, match="unknown: gpu"):
        parse_queues("training,gpu")
