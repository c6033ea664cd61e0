"""Evaluation jobs: a worker pool running Harbor trials on the gym's own sandboxes.

A job mints two keys under the key it is billed to (the run's, or the operator's for
scoring): a *sandbox key* that may create trial sandboxes with a model door, and a *door
key* that may call only the evaluated model through inference. The door key never enters a
sandbox: the door puts it on requests. So every trial's sandbox seconds and every token the
harness spends are metered through the ordinary gateway path to the right budget, and the
keys are revoked when the job ends. Each trial's result is written as soon as it ends, so a
cancel or a crash keeps what was done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from services.core.errors import GymError, ServiceUnavailable
from services.core.keys import KeyRegistry
from services.core.policy import Policy
from services.core.store import Store
from services.core.workers import JobPool
from services.core.tables import utcnow
from services.evaluation.benchmarks import TaskRef
from services.evaluation.harnesses import HarnessStore
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.tables import EvaluationJob, ScoreRow, TrialResultRow
from services.evaluation.trials import TrialOutcome, TrialRequest, run_trial

log = logging.getLogger("rsigym.evaluation")
FINAL = {"succeeded", "failed", "cancelled"}
TrialRunner = Callable[[TrialRequest], Awaitable[TrialOutcome]]


def job_score(rewards: dict[str, list[float | None]]) -> float | None:
    """avg@k: the mean over tasks of each task's mean reward over its attempts (a failed
    attempt counts 0). Full precision; None when nothing ran."""
    per_task = [sum(r or 0.0 for r in attempts) / len(attempts) for attempts in rewards.values() if attempts]
    return sum(per_task) / len(per_task) if per_task else None


class EvaluationRunner:
    def __init__(self, store: Store, registry: BenchmarkRegistry, harnesses: HarnessStore, trials_root: Path,
                 *, workers: int = 1, trial_concurrency: int = 4, runner: TrialRunner = run_trial,
                 gateway_url: Callable[[], str | None] = lambda: None):
        self.store, self.registry, self.harnesses = store, registry, harnesses
        self.keys = KeyRegistry(store)
        self.trials_root = trials_root
        self.trial_concurrency = trial_concurrency
        self.run_trial = runner
        self.gateway_url = gateway_url
        """Where trials reach the gateway: the gym's configured address, read when a job runs
        (never the row's, never a request's), since the trial's keys are sent there."""
        self.pool = JobPool(workers, "rsigym-eval")

    def recover(self) -> None:
        with self.store.transaction() as s:
            s.execute(update(EvaluationJob).where(EvaluationJob.status == "running").values(
                status="failed", error="the gym restarted during this job", finished_at=utcnow()))
            queued = s.scalars(select(EvaluationJob.id).where(EvaluationJob.status == "queued")).all()
        for job_id in queued:
            self.submit(job_id)

    def submit(self, job_id: str) -> None:
        self.pool.submit(self._run_safely, job_id)

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self.pool.wait_idle(timeout)

    def shutdown(self) -> None:
        """Ask running jobs to stop after their current trials; best effort (the store may be gone)."""
        try:
            with self.store.transaction() as s:
                s.execute(update(EvaluationJob).where(EvaluationJob.status.in_(("queued", "running")))
                          .values(cancel_requested=True))
        except Exception as err:  # noqa: BLE001 - stopping must not fail; recover() fails them at next start
            log.warning("evaluation shutdown could not flag running jobs: %s", type(err).__name__)
        self.pool.shutdown()

    def _run_safely(self, job_id: str) -> None:
        try:
            self._run(job_id)
        except Exception as err:  # the job fails; the worker lives on
            log.exception("evaluation job %s failed", job_id)
            message = err.message if isinstance(err, GymError) else f"{type(err).__name__}: {err}"
            self._finish(job_id, "failed", message)

    def _run(self, job_id: str) -> None:
        with self.store.transaction() as s:
            job = s.get(EvaluationJob, job_id)
            if job is None or job.status != "queued":
                return
            if job.cancel_requested:
                job.status, job.finished_at = "cancelled", utcnow()
                return
            job.status, job.started_at = "running", utcnow()
            s.flush()
            s.expunge(job)
        benchmark = self.registry.load(job.benchmark)
        tasks = {t.id: t for split, t in benchmark.tasks() if job.split in ("*", split.name)}
        harness_dir = self.harnesses.directory(job.harness, run_id=None) if job.purpose != "validation" else None
        gateway = self.gateway_url()
        if not gateway:
            raise ServiceUnavailable("the gym does not know its own address (RSIGYM_GATEWAY_URL)")
        sandbox_key, door_key, minted = self._mint_keys(job)
        try:
            asyncio.run(self._trials(job, [tasks[t] for t in job.task_ids], harness_dir, sandbox_key, door_key,
                                     gateway))
        finally:
            for key_id in minted:
                try:
                    self.keys.set_status(key_id, "revoked")
                except GymError as err:
                    log.warning("job %s: key %s not revoked: %s", job_id, key_id, err.message)
        with self.store.transaction() as s:
            cancelled = s.get(EvaluationJob, job_id).cancel_requested
        self._finish(job_id, "cancelled" if cancelled else "succeeded", None)

    def _mint_keys(self, job: EvaluationJob) -> tuple[str, str, list[str]]:
        scoring = job.purpose in ("score", "baseline", "validation")
        sandbox_view, sandbox_key = self.keys.create(
            policy=Policy.model_validate({"services": {"sandbox": {
                "door": True, "internet": False, "max_concurrency": self.trial_concurrency}}}),
            budget_nusd=None, parent_id=job.key_id, name=f"evaluation {job.id} sandboxes", platform=True)
        inference: dict[str, Any] = {"models": [job.model], "max_concurrency": self.trial_concurrency}
        if scoring:
            inference["cross_run"] = True
        door_view, door_key = self.keys.create(
            policy=Policy.model_validate({"services": {"inference": inference}}), budget_nusd=None,
            parent_id=job.key_id, name=f"evaluation {job.id} model door", platform=True)
        return sandbox_key, door_key, [sandbox_view["id"], door_view["id"]]

    async def _trials(self, job: EvaluationJob, tasks: list[TaskRef], harness_dir: Path | None, sandbox_key: str,
                      door_key: str, gateway_url: str) -> None:
        gate = asyncio.Semaphore(self.trial_concurrency)
        trials_dir = self.trials_root / job.id

        async def one(task: TaskRef, attempt: int, agent: str) -> None:
            async with gate:
                if await asyncio.to_thread(self._cancelled, job.id):
                    return
                request = TrialRequest(
                    task=task, harness_dir=harness_dir, gateway_url=gateway_url, sandbox_key=sandbox_key,
                    door_key=door_key, model=job.model, sampling=dict(job.sampling), attempt=attempt,
                    trials_dir=trials_dir, agent=agent)  # type: ignore[arg-type]
                outcome = await self.run_trial(request)
                if job.purpose == "validation" and outcome.reward is None and outcome.error:
                    # the run itself broke (not the oracle's answer): judge the task on a second run
                    log.warning("validation of %s/%s: retrying after %s", job.benchmark, task.id, outcome.error)
                    outcome = await self.run_trial(request)
                await asyncio.to_thread(self._record, job.id, outcome, attempt)

        if job.purpose == "validation":  # the oracle must score 1, doing nothing must score 0
            plan = [(t, 1, "oracle") for t in tasks] + [(t, 2, "nop") for t in tasks]
        else:
            plan = [(t, a, "harness") for t in tasks for a in range(1, job.attempts + 1)]
        await asyncio.gather(*(one(t, a, agent) for t, a, agent in plan))

    def _cancelled(self, job_id: str) -> bool:
        with self.store.transaction() as s:
            return bool(s.scalar(select(EvaluationJob.cancel_requested).where(EvaluationJob.id == job_id)))

    def _record(self, job_id: str, outcome: TrialOutcome, attempt: int) -> None:
        with self.store.transaction() as s:
            s.add(TrialResultRow(
                job_id=job_id, task_id=outcome.task_id, attempt=attempt, reward=outcome.reward, error=outcome.error,
                trajectory=outcome.trajectory, verifier_output=(outcome.verifier_output or "")[-20000:],
                agent_output=(outcome.agent_output or "")[-20000:], sandbox_id=outcome.sandbox_id,
                started_at=outcome.started_at, finished_at=outcome.finished_at))
            s.execute(update(EvaluationJob).where(EvaluationJob.id == job_id)
                      .values(trials_done=EvaluationJob.trials_done + 1))

    def _finish(self, job_id: str, status: str, error: str | None) -> None:
        with self.store.transaction() as s:
            job = s.get(EvaluationJob, job_id)
            if job is None or job.status in FINAL:
                return
            rows = s.scalars(select(TrialResultRow).where(TrialResultRow.job_id == job_id)).all()
            rewards: dict[str, list[float | None]] = {}
            for r in rows:
                rewards.setdefault(r.task_id, []).append(r.reward)
            job.score = job_score(rewards) if job.purpose != "validation" else None
            job.status, job.error, job.finished_at = status, error, utcnow()
            s.execute(update(ScoreRow).where(ScoreRow.job_id == job_id).values(
                score=job.score if status == "succeeded" else None, status=status))
        if job.purpose == "validation":
            self.registry.finish_validation(job_id)
