"""Evaluation jobs: Harbor trials on the gym's own sandboxes, run by one or more workers.

Each worker taking part in a job mints two keys under the key it is billed to (the run's, or
the operator's for scoring): a *sandbox key* that may create trial sandboxes with a model door,
and a *door key* that may call only the evaluated model through inference. The door key never
enters a sandbox: the door puts it on requests. So every trial's sandbox seconds and every token
the harness spends are metered through the ordinary gateway path to the right budget, and the
keys are revoked when that worker is done. A judged benchmark's job (``[judge] model``) mints a
third, the *judge key*, always below the operator's key — the run's own dev evaluation included: the
judge is the benchmark's cost, never the run's — that may call only the judge model through
rollout; only the verifier's sandbox gets a door with it. A trial is claimed in the store before it runs
(:class:`~services.evaluation.tables.TrialClaim`), so several workers can share one job's trials,
and its result is written as soon as it ends, so a cancel, a crash or a resumed job keeps what
was done and never runs a recorded trial again.

A trial that fails is not always the agent's 0 (services/evaluation/failures.py): a platform
failure (the gateway trials call back on unreachable, the sandbox service down) or a verifier that
gave no reward is run again, :data:`TRIAL_RETRIES` times at most, and if it persists the job
stops taking trials and fails, naming the kind, how many trials and one of them — it never
succeeds with them counted as zeros. Only the agent's own failures score 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from access.keys import KeyRegistry
from access.policy import Policy
from billing.storage_quota import tree_bytes
from jobs.lifecycle import Dispatcher, JobRunnerBase, PoolDispatcher
from kit.display_text import inert
from kit.errors import GymError, QuotaExceeded, ServiceUnavailable
from kit.settings import JobSettings
from services.evaluation import templates
from services.evaluation.benchmarks import Judge, TaskRef
from services.evaluation.comparisons import dev_comparison
from services.evaluation.failures import RETRIED, FailureKind, failure_kind
from services.evaluation.harbor.trial_sandboxes import JudgeDoor
from services.evaluation.harnesses import HarnessStore
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.tables import EvaluationJob, ScoreRow, TrialClaim, TrialResultRow
from services.evaluation.trials import TrialOutcome, TrialRequest, run_trial, unbuilt_outcome
from services.records.events import EVALUATION_JOB, OPERATOR_RECORD, EventLog
from storage.store import Store
from storage.tables import ApiKey, utcnow

log = logging.getLogger("rsigym.evaluation")
FINAL = {"succeeded", "failed", "cancelled"}
TrialRunner = Callable[[TrialRequest], Awaitable[TrialOutcome]]
TASK_OF_PURPOSE = {"agent": "run", "score": "score", "baseline": "baseline", "validation": "validation"}
ASSIST_TASK = "rsigym.evaluation.assist"
"""A helper: another worker sharing a running job's trials (see :meth:`EvaluationRunner.assist`)."""
CLAIM_POLL_S = 0.2
RECORDED_PURPOSES = ("agent", "score", "baseline")
"""Jobs whose end is a platform event (validations are the benchmark's, kept on its row)."""
TRIAL_RETRIES = 2
"""How many times a trial that failed on the platform or its verifier is run again."""
RETRY_BACKOFF_S = (2.0, 5.0)
"""The wait before each of those runs: an outage of a few seconds (a gateway restarting) is ridden out."""
OPERATOR_PURPOSES = ("score", "baseline", "validation")
"""The operator's jobs: billed to the operator's key, never charged to a run's storage quota
(their evidence is always kept), and their ends recorded on the operator's record, never on
the scored run's, which its own keys read (an open run would read its official score there)."""


class _AlreadyRecorded(Exception):
    """Rolls a claim back: the trial was recorded meanwhile."""


def job_score(rewards: dict[str, list[float | None]]) -> float | None:
    """avg@k: the mean over tasks of each task's mean reward over its attempts. Full precision;
    None when nothing ran. The caller passes an agent's failed attempt as 0 (the seeds rule);
    None stands for an attempt nobody scored (a platform or verifier failure,
    services/evaluation/failures.py), and one such leaves the whole job without a score: it is
    never counted as 0."""
    if any(r is None for attempts in rewards.values() for r in attempts):
        return None
    per_task = [sum(r or 0.0 for r in attempts) / len(attempts) for attempts in rewards.values() if attempts]
    return sum(per_task) / len(per_task) if per_task else None


class EvaluationRunner(JobRunnerBase):
    """Evaluation jobs on the common job lifecycle (jobs/lifecycle.py). They resume: a job
    whose worker died is queued again and the next worker runs only the trials not yet recorded."""

    table = EvaluationJob
    kind = "evaluation"
    final = frozenset(FINAL)
    resumable = True

    def __init__(self, store: Store, registry: BenchmarkRegistry, harnesses: HarnessStore, trials_root: Path,
                 *, workers: int = 1, trial_concurrency: int = 4, runner: TrialRunner = run_trial,
                 gateway_url: Callable[[], str | None] = lambda: None, dispatcher: Dispatcher | None = None,
                 job_settings: JobSettings | None = None, workers_per_job: int = 1, events: EventLog | None = None,
                 max_running_per_run: int | None = None, operator_key: Callable[[], str] | None = None):
        super().__init__(store, workers=workers, name="rsigym-eval", settings=job_settings, dispatcher=dispatcher,
                         max_running_per_run=max_running_per_run)
        self.events = events
        self.workers_per_job = workers_per_job
        self.registry, self.harnesses = registry, harnesses
        self.keys = KeyRegistry(store)
        self.trials_root = trials_root
        self.trial_concurrency = trial_concurrency
        self.run_trial = runner
        self.gateway_url = gateway_url
        self.operator_key = operator_key
        """The operator's root key (made on first use), which judged benchmarks' judges are paid from."""
        """Where trials reach the gateway: the gym's configured address, read when a job runs
        (never the row's, never a request's), since the trial's keys are sent there."""

    def capped_clause(self, table: Any) -> Any:
        """Only an agent's own jobs count against its run's cap; the operator's (validation,
        scoring, baselines) are the platform's and never wait for the run's jobs."""
        return table.purpose == "agent"

    def task_name(self, job: Any) -> str:
        """One Celery task per purpose (agent runs, scoring, baselines, benchmark validation)."""
        return f"rsigym.evaluation.{TASK_OF_PURPOSE.get(job.purpose, 'run')}"

    def shutdown(self) -> None:
        """Embedded: ask running jobs to stop after their current trials; best effort (the store
        may be gone). Celery workers' jobs are not this process's to stop."""
        if isinstance(self.dispatcher, PoolDispatcher):
            try:
                with self.store.transaction() as s:
                    s.execute(update(EvaluationJob).where(EvaluationJob.status.in_(("queued", "running")))
                              .values(cancel_requested=True))
            except Exception as err:  # noqa: BLE001 - stopping must not fail; recover() reaps them at next start
                log.warning("evaluation shutdown could not flag running jobs: %s", type(err).__name__)
        super().shutdown()

    def describe_error(self, err: Exception) -> str:
        return err.message if isinstance(err, GymError) else f"{type(err).__name__}: {err}"

    # -- running: an owner, and helpers that share its trials ------------------------------

    def task_body(self, task: str) -> Callable[[str], bool]:
        return self.assist if task == ASSIST_TASK else self.execute

    def extra_tasks(self, job: Any) -> list[str]:
        """Helpers sent with a job: ``workers_per_job - 1`` assist tasks, so that many workers share its trials."""
        return [ASSIST_TASK] * (self.workers_per_job - 1)

    def _run(self, job: EvaluationJob) -> None:
        """The owner: runs trials until none is left to claim, then waits for the trials helpers
        hold (taking back those whose helper died), and finishes the job."""
        job_id = job.id
        while True:
            self._participate(job)
            if self._stopped(job_id) or self._complete(job) or self._unscored(job_id):
                break
            self._drop_stale_claims(job_id)
            time.sleep(CLAIM_POLL_S)
        with self.store.transaction() as s:
            cancelled = bool(s.scalar(select(EvaluationJob.cancel_requested).where(EvaluationJob.id == job_id)))
        unscored = None if cancelled else self._unscored(job_id)
        if unscored is not None:
            self._finish(job_id, "failed", unscored)
            return
        self._finish(job_id, "cancelled" if cancelled else "succeeded", None)

    def _unscored(self, job_id: str) -> str | None:
        """Why the job cannot be scored: its recorded trials that failed on the platform or the
        verifier after their retries (the kind, how many, one example); None when there are none."""
        with self.store.transaction() as s:
            rows = s.execute(select(TrialResultRow.task_id, TrialResultRow.attempt, TrialResultRow.reward,
                                    TrialResultRow.error, TrialResultRow.failure_kind)
                             .where(TrialResultRow.job_id == job_id)
                             .order_by(TrialResultRow.task_id, TrialResultRow.attempt)).all()
        failed: dict[FailureKind, list[tuple[str, int, str | None]]] = {}
        for task_id, attempt, reward, error, kind in rows:
            resolved = failure_kind(reward, error, kind)
            if resolved in RETRIED:
                failed.setdefault(resolved, []).append((task_id, attempt, error))
        if not failed:
            return None
        parts = [f"{kind} failure: {len(trials)} trial(s) failed after {TRIAL_RETRIES} retries each, e.g. "
                 f"{trials[0][0]} attempt {trials[0][1]}: {(trials[0][2] or 'no reward')[:300]}"
                 for kind, trials in sorted(failed.items())]
        return "; ".join(parts) + " (not scored: a platform or verifier failure is not the agent's 0)"

    def assist(self, job_id: str) -> bool:
        """A helper task: share a running job's trials (or own the job if it is still queued).
        The owner finishes it; a helper that dies leaves claims that go stale and are rerun."""
        with self.store.transaction() as s:
            status = s.scalar(select(EvaluationJob.status).where(EvaluationJob.id == job_id))
        if status == "queued" and self.execute(job_id):
            return True
        with self.store.transaction() as s:  # someone else holds it (maybe just now): help
            job = s.get(EvaluationJob, job_id)
            if job is None or job.status != "running":
                return False
            s.expunge(job)
        with self._heartbeat(job_id, own_job=False):
            try:
                self._participate(job)
            except Exception:  # noqa: BLE001 - a helper's failure is not the job's: the owner reruns its trials
                log.exception("evaluation job %s: helper %s failed", job_id, self.worker_id)
        return True

    def _beat(self, session: Session, job_id: str) -> None:
        session.execute(update(TrialClaim).where(TrialClaim.job_id == job_id, TrialClaim.worker == self.worker_id)
                        .values(heartbeat_at=utcnow()).execution_options(synchronize_session=False))

    def _plan(self, job: EvaluationJob) -> list[tuple[str, int, str]]:
        if job.purpose == "validation":  # the oracle must score 1, doing nothing must score 0
            return [(t, 1, "oracle") for t in job.task_ids] + [(t, 2, "nop") for t in job.task_ids]
        return [(t, a, "harness") for t in job.task_ids for a in range(1, job.attempts + 1)]

    def _participate(self, job: EvaluationJob) -> None:
        """Run trials of the job, claiming each in the store first, until none is left to claim."""
        if self._stopped(job.id) or not self._open_trials(job):
            return
        benchmark = self.registry.load(job.benchmark)
        tasks = {t.id: t for split, t in benchmark.tasks() if job.split in ("*", split.name)}
        harness_dir = self.harnesses.directory(job.harness, run_id=None) if job.purpose != "validation" else None
        gateway = self.gateway_url()
        if not gateway:
            raise ServiceUnavailable("the gym does not know its own address (RSIGYM_GATEWAY_URL)")
        sandbox_key, door_key, minted = self._mint_keys(job)
        try:
            if job.purpose == "validation":  # tasks whose Dockerfile has RUN get their template now
                templates.save(benchmark.root, templates.build_templates(
                    tasks.values(), gateway, self._mint_builder(job, minted)))
            built = templates.load(benchmark.root)
            judge = self._mint_judge(job, benchmark.judge, minted) if benchmark.judge is not None else None
            asyncio.run(self._trials(job, tasks, harness_dir, sandbox_key, door_key, gateway, judge, built))
        finally:
            for key_id in minted:
                try:
                    self.keys.set_status(key_id, "revoked")
                except GymError as err:
                    log.warning("job %s: key %s not revoked: %s", job.id, key_id, err.message)

    def _mint_keys(self, job: EvaluationJob) -> tuple[str, str, list[str]]:
        scoring = job.purpose in OPERATOR_PURPOSES
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

    def _mint_builder(self, job: EvaluationJob, minted: list[str]) -> str:
        """A validation job's key that may build sandbox templates (a platform grant, below the
        operator's key that validations run on); appended to ``minted`` to be revoked with the rest."""
        view, key = self.keys.create(
            policy=Policy.model_validate({"services": {"sandbox": {"build": True, "internet": False}}}),
            budget_nusd=None, parent_id=job.key_id, name=f"evaluation {job.id} template builds", platform=True)
        minted.append(view["id"])
        return key

    def _mint_judge(self, job: EvaluationJob, judge: Judge, minted: list[str]) -> JudgeDoor:
        """The judge key of a judged benchmark's job: below the operator's key whoever's job it
        is (an agent's dev evaluation too), rollout of the judge model only (and at most its
        ``max_tokens``); appended to ``minted`` so it is revoked with the job's other keys."""
        if job.purpose in OPERATOR_PURPOSES:
            parent = job.key_id
        elif self.operator_key is not None:
            parent = self.operator_key()
        else:
            raise ServiceUnavailable("this gym's evaluation runner has no operator key to pay a benchmark's judge")
        rollout: dict[str, Any] = {"models": [judge.model], "max_concurrency": self.trial_concurrency}
        if judge.max_tokens is not None:
            rollout["fields"] = {"max_tokens": {"range": [1, judge.max_tokens]}}
        view, key = self.keys.create(policy=Policy.model_validate({"services": {"rollout": rollout}}),
                                     budget_nusd=None, parent_id=parent, name=f"evaluation {job.id} judge",
                                     platform=True)
        minted.append(view["id"])
        return JudgeDoor(key=key, model=judge.model, max_tokens=judge.max_tokens)

    async def _trials(self, job: EvaluationJob, tasks: dict[str, TaskRef], harness_dir: Path | None,
                      sandbox_key: str, door_key: str, gateway_url: str, judge: JudgeDoor | None = None,
                      built: templates.TaskTemplates | None = None) -> None:
        trials_dir = self.trials_root / job.id
        built = built or templates.TaskTemplates()

        async def lane() -> None:
            while (claimed := await asyncio.to_thread(self._claim_trial, job)) is not None:
                task_id, attempt, agent = claimed
                request = TrialRequest(
                    task=tasks[task_id], harness_dir=harness_dir, gateway_url=gateway_url, sandbox_key=sandbox_key,
                    door_key=door_key, model=job.model, sampling=dict(job.sampling), attempt=attempt,
                    trials_dir=trials_dir, agent=agent, judge=judge,  # type: ignore[arg-type]
                    template=built.template_of(task_id))
                if task_id in built.failed:  # the task's own Dockerfile: nothing to run, nothing to retry
                    outcome = unbuilt_outcome(request, built.failed[task_id])
                else:
                    outcome = await self._run_with_retries(job, request)
                await asyncio.to_thread(self._record, job.id, outcome, attempt)

        await asyncio.gather(*(lane() for _ in range(self.trial_concurrency)))

    async def _run_with_retries(self, job: EvaluationJob, request: TrialRequest) -> TrialOutcome:
        """Run the trial; run it again (after a short wait) while it failed on the platform or the
        verifier, :data:`TRIAL_RETRIES` times at most. A validation's oracle or empty answer that
        failed otherwise gets one more run too (the run itself broke, not the task's answer: judge
        the task on a second run)."""
        outcome = await self.run_trial(request)
        for n, wait in enumerate(RETRY_BACKOFF_S[:TRIAL_RETRIES]):
            kind = failure_kind(outcome.reward, outcome.error, outcome.failure_kind)
            if kind is None:
                break
            if kind not in RETRIED and not (job.purpose == "validation" and outcome.reward is None and n == 0):
                break
            log.warning("job %s: trial %s/%d failed (%s), running it again in %.0f s: %s", job.id, request.task.id,
                        request.attempt, kind, wait if kind in RETRIED else 0, inert(outcome.error or "no reward"))
            await asyncio.sleep(wait if kind in RETRIED else 0)
            if await asyncio.to_thread(self._stopped, job.id):
                break
            outcome = await self.run_trial(request)
        return outcome

    def _stopped(self, job_id: str) -> bool:
        """Cancel requested, or the job is no longer running (finished, or re-queued after a reap)."""
        with self.store.transaction() as s:
            return self._stopped_in(s, job_id)

    @staticmethod
    def _stopped_in(s: Session, job_id: str) -> bool:
        row = s.execute(select(EvaluationJob.cancel_requested, EvaluationJob.status)
                        .where(EvaluationJob.id == job_id)).first()
        return row is None or bool(row[0]) or row[1] != "running"

    @staticmethod
    def _failed_in(s: Session, job_id: str) -> bool:
        """A trial of the job failed on the platform or its verifier after its retries: the job will
        fail unscored, so no further trial is taken (one SQL count, in the claim's transaction)."""
        return bool(s.scalar(select(func.count()).select_from(TrialResultRow).where(
            TrialResultRow.job_id == job_id, TrialResultRow.failure_kind.in_(sorted(RETRIED)))))

    def _open_trials(self, job: EvaluationJob) -> list[tuple[str, int, str]]:
        """Trials neither recorded nor claimed, in plan order."""
        with self.store.transaction() as s:
            return self._open_in(s, job)

    def _open_in(self, s: Session, job: EvaluationJob) -> list[tuple[str, int, str]]:
        taken = {(t, a) for t, a in s.execute(
            select(TrialResultRow.task_id, TrialResultRow.attempt).where(TrialResultRow.job_id == job.id))}
        taken |= {(t, a) for t, a in s.execute(
            select(TrialClaim.task_id, TrialClaim.attempt).where(TrialClaim.job_id == job.id))}
        return [p for p in self._plan(job) if (p[0], p[1]) not in taken]

    def _claim_trial(self, job: EvaluationJob) -> tuple[str, int, str] | None:
        """Take one open trial for this worker (a primary-key insert: one claimer per trial); None
        when the job is stopped (cancel requested, finished, re-queued) or nothing is left open.
        One transaction: a trial's claim costs one round trip to the store, not three."""
        with self.store.transaction() as s:
            if self._stopped_in(s, job.id) or self._failed_in(s, job.id):
                return None
            for task_id, attempt, agent in self._open_in(s, job):
                try:
                    with s.begin_nested():
                        s.add(TrialClaim(job_id=job.id, task_id=task_id, attempt=attempt, worker=self.worker_id,
                                         heartbeat_at=utcnow()))
                        s.flush()  # waits for (then fails on) a claim another worker holds
                        if s.scalar(select(func.count()).select_from(TrialResultRow).where(
                                TrialResultRow.job_id == job.id, TrialResultRow.task_id == task_id,
                                TrialResultRow.attempt == attempt)):
                            raise _AlreadyRecorded  # its result landed after the open trials were read
                    return task_id, attempt, agent
                except (IntegrityError, _AlreadyRecorded):
                    continue  # another worker took it first
        return None

    def _complete(self, job: EvaluationJob) -> bool:
        with self.store.transaction() as s:
            recorded = s.scalar(select(func.count()).select_from(TrialResultRow)
                                .where(TrialResultRow.job_id == job.id))
        return (recorded or 0) >= len(self._plan(job))

    def _drop_stale_claims(self, job_id: str) -> int:
        """Claims whose worker stopped beating (a helper died): the trials become open again."""
        cutoff = utcnow() - self._ttl()
        with self.store.transaction() as s:
            return int(s.execute(delete(TrialClaim).where(TrialClaim.job_id == job_id, TrialClaim.heartbeat_at < cutoff)
                                 .execution_options(synchronize_session=False)).rowcount)  # type: ignore[attr-defined]

    def _record(self, job_id: str, outcome: TrialOutcome, attempt: int) -> None:
        """The trial's result, written as it ends; its claim goes in the same transaction. A trial
        recorded meanwhile by another worker (this one's claim went stale) is kept, not doubled."""
        trajectory = outcome.trajectory
        verifier_output, agent_output = (outcome.verifier_output or "")[-20000:], (outcome.agent_output or "")[-20000:]
        trial_dir = Path(outcome.result_path).parent if outcome.result_path else None
        try:
            with self.store.transaction() as s:
                if not self._metered(s, job_id, trajectory, verifier_output, agent_output, trial_dir):
                    trajectory = None
                    verifier_output, agent_output = verifier_output[-2000:], (
                        "[trajectory and trial files not kept: the run's storage quota is used up]\n" + agent_output[-2000:])
                    if trial_dir is not None:
                        shutil.rmtree(trial_dir, ignore_errors=True)
                s.add(TrialResultRow(
                    job_id=job_id, task_id=outcome.task_id, attempt=attempt, reward=outcome.reward,
                    error=outcome.error, failure_kind=failure_kind(outcome.reward, outcome.error, outcome.failure_kind),
                    trajectory=trajectory,
                    verifier_output=verifier_output,
                    agent_output=agent_output, sandbox_id=outcome.sandbox_id,
                    started_at=outcome.started_at, finished_at=outcome.finished_at, judge=outcome.judge))
                s.flush()
                s.execute(update(EvaluationJob).where(EvaluationJob.id == job_id)
                          .values(trials_done=EvaluationJob.trials_done + 1))
                s.execute(delete(TrialClaim).where(TrialClaim.job_id == job_id, TrialClaim.task_id == outcome.task_id,
                                                   TrialClaim.attempt == attempt))
        except IntegrityError:
            log.warning("job %s: trial %s/%d was already recorded by another worker", job_id, outcome.task_id, attempt)
            with self.store.transaction() as s:
                s.execute(delete(TrialClaim).where(TrialClaim.job_id == job_id, TrialClaim.task_id == outcome.task_id,
                                                   TrialClaim.attempt == attempt, TrialClaim.worker == self.worker_id))

    def _metered(self, s: Session, job_id: str, trajectory: dict[str, Any] | None, verifier_output: str,
                 agent_output: str, trial_dir: Path | None) -> bool:
        """Charge a run's trial to its storage quota in the recording transaction: the trajectory
        and the trial's files on disk (``trajectories``), its outputs (``results``). False when
        they do not fit: the reward is recorded all the same (the trial ran and was paid for), its
        trajectory and files are not kept. Scoring, baseline and validation trials are the
        operator's, not a run's: a run that fills its quota cannot make its scoring lose evidence."""
        quota = self.harnesses.quota
        job = s.get(EvaluationJob, job_id)
        if quota is None or job is None or job.purpose in OPERATOR_PURPOSES:
            return True
        kept = (len(json.dumps(trajectory).encode()) if trajectory is not None else 0) + (
            tree_bytes(trial_dir) if trial_dir is not None and trial_dir.is_dir() else 0)
        try:
            with s.begin_nested():
                quota.charge(s, job.run_id, "trajectories", kept, param=None)
                quota.charge(s, job.run_id, "results", len(verifier_output.encode()) + len(agent_output.encode()),
                             param=None)
        except QuotaExceeded:
            log.warning("job %s: run %s is over its storage quota; a trial's trajectory is not kept", job_id, job.run_id)
            return False
        return True

    def _on_final(self, session: Session, job_id: str, status: str) -> None:
        """In the finishing transaction: the job's score from the recorded trials, and its score row."""
        job = session.get(EvaluationJob, job_id, populate_existing=True)
        if job is None:
            return
        rows = session.scalars(select(TrialResultRow).where(TrialResultRow.job_id == job_id)).all()
        rewards: dict[str, list[float | None]] = {}
        for r in rows:  # an agent's failure is its 0; a platform or verifier failure is nobody's score (None)
            kind = failure_kind(r.reward, r.error, r.failure_kind)
            rewards.setdefault(r.task_id, []).append(None if kind in RETRIED else (r.reward or 0.0))
        job.score = job_score(rewards) if job.purpose != "validation" else None
        session.execute(update(ScoreRow).where(ScoreRow.job_id == job_id).values(
            score=job.score if status == "succeeded" else None, status=status))
        if self.events is not None and job.purpose in RECORDED_PURPOSES:
            data = {"job_id": job.id, "purpose": job.purpose, "status": status, "model": job.model,
                    "harness": job.harness, "benchmark": job.benchmark, "split": job.split,
                    "attempts": job.attempts, "score": job.score if status == "succeeded" else None}
            comparison = dev_comparison(session, job) if status == "succeeded" else None
            if comparison is not None:  # a checkpoint vs its parent, with its interval (the agent's record)
                data["comparison"] = comparison
            if job.purpose in OPERATOR_PURPOSES:  # on the operator's record, naming what it scored
                scored = session.execute(select(ScoreRow.run_id, ScoreRow.submission_id)
                                         .where(ScoreRow.job_id == job.id)).first()
                data.update(scored_run=scored[0] if scored else job.run_id,
                            submission_id=scored[1] if scored else None)
            self.events.append(session, run_id=job.run_id if job.purpose == "agent" else OPERATOR_RECORD,
                               kind=EVALUATION_JOB, key_id=job.key_id, experiment_id=job.experiment_id, data=data)

    def cancel_queued(self, job_id: str) -> bool:
        """Cancel a job no worker has taken yet; it ends like any other (its final hooks run)."""
        with self.store.transaction() as s:
            done = s.execute(update(EvaluationJob).where(EvaluationJob.id == job_id, EvaluationJob.status == "queued")
                             .values(status="cancelled", finished_at=utcnow())
                             .execution_options(synchronize_session=False)).rowcount  # type: ignore[attr-defined]
            if done != 1:
                return False
            self._on_final(s, job_id, "cancelled")
        self._after_final(job_id, "cancelled", None)
        return True

    def _after_final(self, job_id: str, status: str, error: str | None) -> None:
        with self.store.transaction() as s:
            purpose = s.scalar(select(EvaluationJob.purpose).where(EvaluationJob.id == job_id))
        if purpose == "validation":
            self.registry.finish_validation(job_id)

    def _after_reaped(self, job_id: str) -> None:
        """A dead worker could not revoke the keys it minted for the job's trials: revoke them here."""
        with self.store.transaction() as s:
            minted = s.scalars(select(ApiKey.id).where(ApiKey.name.like(f"evaluation {job_id} %"),
                                                        ApiKey.status != "revoked")).all()
        for key_id in minted:
            try:
                self.keys.set_status(key_id, "revoked")
            except GymError as err:
                log.warning("job %s: key %s not revoked: %s", job_id, key_id, err.message)
