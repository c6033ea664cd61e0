"""What other packages may read of evaluation's store rows: a run's jobs in flight (the gateway's
``/admin/v1/runs/{id}/jobs``) and where the registered benchmarks are (the records' contamination
audit) — views, never the table classes, so evaluation's tables stay its own. Light: the gateway
imports it (no harbor)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.lifecycle import OPEN, finished_counts, queue_figures
from services.evaluation.failures import failure_kind
from services.evaluation.submissions import final_submission as final_submission_row
from services.evaluation.tables import (
    BenchmarkRow,
    EvaluationJob,
    HarnessRow,
    ScoreRow,
    SubmissionRow,
    TrialResultRow,
)
from storage.pages import by_creation, listing, progress, view
from storage.store import Store


def unfinished_jobs(s: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's queued and running evaluation jobs (scoring jobs too, with their ``purpose``), in ``s``."""
    jobs = s.scalars(select(EvaluationJob).where(EvaluationJob.run_id == run_id, EvaluationJob.status.in_(OPEN)))
    return [{"id": job.id, "kind": "evaluation", "status": job.status, "model": job.model,
             "benchmark": job.benchmark, "purpose": job.purpose,
             "done": job.trials_done, "total": job.trials_total, "progress": progress(job.trials_done, job.trials_total),
             "created_at": job.created_at.isoformat(),
             "started_at": job.started_at.isoformat() if job.started_at else None}
            for job in jobs]


def registered_benchmark_paths(store: Store) -> list[str]:
    """Where each registered benchmark's copy is, by benchmark name."""
    with store.transaction() as s:
        return [row.path for row in s.scalars(select(BenchmarkRow).order_by(BenchmarkRow.name))]


@dataclass(frozen=True)
class Harness:
    """An uploaded harness: its id and the sha256 its archive (and unpacked tree) are stored under."""

    id: str
    sha256: str


def run_harness(store: Store, run_id: str, harness_id: str) -> Harness | None:
    """The run's harness ``harness_id``; None when there is none or another run uploaded it."""
    with store.transaction() as s:
        row = s.get(HarnessRow, harness_id)
        return Harness(row.id, row.sha256) if row is not None and row.run_id == run_id else None


@dataclass(frozen=True)
class FinishedJob:
    """A succeeded evaluation job and the split it ran on (the records' score-gap audit)."""

    id: str
    split: str


def benchmark_splits(s: Session) -> list[tuple[str, dict[str, Any]]]:
    """Each registered benchmark's name and splits (``{split: {"hidden": ..., ...}}``), by name, in ``s``."""
    return [(row.name, dict(row.splits or {})) for row in s.scalars(select(BenchmarkRow).order_by(BenchmarkRow.name))]


def newest_scoring(s: Session, run_id: str, submission_id: str, benchmark: str,
                   splits: list[str]) -> FinishedJob | None:
    """The job behind the newest score of the submission on one of ``splits`` whose scoring job
    succeeded; None when there is none."""
    row = s.execute(select(ScoreRow.split, EvaluationJob.id).join(EvaluationJob, EvaluationJob.id == ScoreRow.job_id)
                    .where(ScoreRow.run_id == run_id, ScoreRow.submission_id == submission_id,
                           ScoreRow.benchmark == benchmark, ScoreRow.split.in_(splits), ScoreRow.cell.is_(None),
                           EvaluationJob.status == "succeeded")
                    .order_by(ScoreRow.created_at.desc())).first()
    return None if row is None else FinishedJob(row.id, row.split)


def succeeded_agent_jobs(s: Session, run_id: str, benchmark: str, splits: list[str], model: str | None,
                         harness: str) -> list[FinishedJob]:
    """The run's own evaluations (not scorings) of ``model`` with ``harness`` on ``splits`` of
    ``benchmark`` that succeeded."""
    jobs = s.scalars(select(EvaluationJob).where(
        EvaluationJob.run_id == run_id, EvaluationJob.purpose == "agent", EvaluationJob.benchmark == benchmark,
        EvaluationJob.split.in_(splits), EvaluationJob.model == model, EvaluationJob.harness == harness,
        EvaluationJob.status == "succeeded"))
    return [FinishedJob(job.id, job.split) for job in jobs]


def trial_rewards(s: Session, job_ids: list[str]) -> list[tuple[str, float | None]]:
    """(task id, reward) of every trial of the jobs ``job_ids``; None for a trial without a reward."""
    return [(r.task_id, r.reward) for r in s.scalars(select(TrialResultRow).where(TrialResultRow.job_id.in_(job_ids)))]


def job_queues(store: Store) -> dict[str, tuple[int, float]]:
    """Queue → (evaluation jobs waiting, age in seconds of the oldest), every known queue listed (the
    gateway's job gauges)."""
    return queue_figures(store, [EvaluationJob])


def finished_jobs(store: Store) -> dict[tuple[str, str], int]:
    """("evaluation", final status) → evaluation jobs that ended so (the gateway's job gauges)."""
    return finished_counts(store, {"evaluation": EvaluationJob})


# -- what operators read (ops/: the dashboard, the lists across runs) ---------------------------


@dataclass(frozen=True)
class JobView:
    """An evaluation job (or scoring job: ``purpose``) as the operator's pages show it."""

    id: str
    run_id: str
    purpose: str
    status: str
    queue: str
    benchmark: str
    split: str
    model: str
    harness: str
    attempts: int
    trials_done: int
    trials_total: int
    score: float | None
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    worker: str | None = None
    """The worker holding it (host:pid:nonce; None while queued, and once re-queued)."""
    heartbeat_at: datetime | None = None
    """Its worker's last heartbeat (jobs/lifecycle.py: a stale one means the worker died)."""
    claims: int = 0
    """How many times a worker has taken it (more than once: resumed after a lost worker)."""


def jobs(s: Session, *, run_id: str | None = None, in_flight: bool | None = None, newest_first: bool = False,
         limit: int | None = None) -> list[JobView]:
    """Evaluation jobs by creation time, of one run or all (``in_flight``: only queued and running
    ones, or with False only ended ones), in ``s``."""
    rows = by_creation(s, EvaluationJob, run_id=run_id, newest_first=newest_first, limit=limit, in_flight=in_flight,
                       open_statuses=tuple(OPEN))
    return [view(JobView, r) for r in rows]


def job(s: Session, job_id: str) -> JobView | None:
    """The evaluation job ``job_id`` (any run's), in ``s``."""
    row = s.get(EvaluationJob, job_id)
    return None if row is None else view(JobView, row)


def jobs_by_id(s: Session, job_ids: list[str]) -> dict[str, JobView]:
    """The evaluation jobs among ``job_ids`` that exist, by id, in ``s``."""
    if not job_ids:
        return {}
    return {r.id: view(JobView, r) for r in s.scalars(select(EvaluationJob).where(EvaluationJob.id.in_(job_ids)))}


def running_by_queue(s: Session) -> dict[str, int]:
    """Queue → evaluation jobs running on it, in ``s``."""
    rows = s.execute(select(EvaluationJob.queue, func.count()).where(EvaluationJob.status == "running")
                     .group_by(EvaluationJob.queue)).tuples()
    return dict(rows.all())


@dataclass(frozen=True)
class ScoreView:
    """A score row as written when it was scored (its job may have moved on since)."""

    id: str
    run_id: str
    agent: str | None
    submission_id: str | None
    benchmark: str
    split: str
    model: str
    harness: str
    attempts: int
    job_id: str
    score: float | None
    status: str
    created_at: datetime
    subset: int | None = None
    subset_seed: int | None = None
    split_seed: str | None = None
    """The scope a score was taken on (services/evaluation/subsets.py); None: the whole split."""


def scores(s: Session, *, run_id: str | None = None, newest_first: bool = False,
           limit: int | None = None) -> list[ScoreView]:
    """Score rows by creation time, of one run or all, in ``s``: each the run's own score or a
    baseline, never a decomposition cell (``rsigym score --decompose``: services/evaluation/decompose.py)."""
    query = select(ScoreRow).where(ScoreRow.cell.is_(None))
    if run_id is not None:
        query = query.where(ScoreRow.run_id == run_id)
    order = ScoreRow.created_at.desc() if newest_first else ScoreRow.created_at
    return [view(ScoreView, r) for r in s.scalars(query.order_by(order).limit(limit))]


def scored_runs(s: Session, run_ids: set[str]) -> set[str]:
    """Those of ``run_ids`` with a succeeded score (a run's lifecycle: access/lifecycle.py)."""
    if not run_ids:
        return set()
    return set(s.scalars(select(ScoreRow.run_id).where(ScoreRow.run_id.in_(run_ids), ScoreRow.status == "succeeded")
                         .distinct()))


@dataclass(frozen=True)
class SubmissionView:
    """A submission: what model with which harness a run put forward."""

    id: str
    run_id: str
    track: str | None
    checkpoint_id: str | None
    model: str
    harness: str
    created_at: datetime


def submissions(s: Session, *, run_id: str | None = None, newest_first: bool = False,
                limit: int | None = None) -> list[SubmissionView]:
    """Submissions by creation time, of one run or all, in ``s``."""
    return [view(SubmissionView, r) for r in by_creation(s, SubmissionRow, run_id=run_id, newest_first=newest_first,
                                                          limit=limit)]


def final_submission(s: Session, run_id: str) -> SubmissionView | None:
    """The run's final submission (services/evaluation/submissions.py), or None."""
    row = final_submission_row(s, run_id)
    return None if row is None else view(SubmissionView, row)


def scored_submission(s: Session, run_id: str, submission_id: str) -> bool:
    """Has ``submission_id`` of ``run_id`` a succeeded score (the run's own, not a decomposition cell)?"""
    return s.scalar(select(ScoreRow.id).where(ScoreRow.run_id == run_id, ScoreRow.submission_id == submission_id,
                                              ScoreRow.status == "succeeded", ScoreRow.cell.is_(None))
                    .limit(1)) is not None


@dataclass(frozen=True)
class TrialSummary:
    """A trial as a job's trial list shows it. ``failure_kind``: whose failure it was when it
    failed (platform, verifier or agent: services/evaluation/failures.py); only an agent's is its 0."""

    id: int
    task_id: str
    attempt: int
    reward: float | None
    error: str | None
    finished_at: str | None
    failure_kind: str | None


@dataclass(frozen=True)
class Trial(TrialSummary):
    """A trial in full: its job, sandbox, the agent's trajectory and what the verifier and agent printed."""

    job_id: str
    started_at: str | None
    sandbox_id: str | None
    trajectory: dict[str, Any] | None
    verifier_output: str
    agent_output: str


def job_trials(s: Session, job_id: str) -> list[TrialSummary]:
    """The job's trials by task and attempt (their trajectories left unread), in ``s``."""
    rows = s.execute(select(TrialResultRow.id, TrialResultRow.task_id, TrialResultRow.attempt,
                            TrialResultRow.reward, TrialResultRow.error, TrialResultRow.finished_at,
                            TrialResultRow.failure_kind)
                     .where(TrialResultRow.job_id == job_id)
                     .order_by(TrialResultRow.task_id, TrialResultRow.attempt))
    return [TrialSummary(id=r.id, task_id=r.task_id, attempt=r.attempt, reward=r.reward, error=r.error,
                         finished_at=r.finished_at, failure_kind=failure_kind(r.reward, r.error, r.failure_kind))
            for r in rows]


def trial(s: Session, trial_id: int) -> Trial | None:
    """The trial ``trial_id`` (any job's), in ``s``."""
    row = s.get(TrialResultRow, trial_id)
    if row is None:
        return None
    found = view(Trial, row)
    return replace(found, failure_kind=failure_kind(row.reward, row.error, row.failure_kind))


OPERATOR_KEY_NAME = "rsigym-operator"
"""The name of the gym's own root key that scoring and validation are billed to (service.py makes
it once); views that list runs keep it apart."""

EVALUATION_JOBS = listing(EvaluationJob, EvaluationJob.created_at,
                          ("id", "run_id", "key_id", "purpose", "status", "benchmark", "split", "model", "harness",
                           "attempts", "trials_done", "trials_total", "score", "experiment_id", "error",
                           "created_at", "started_at", "finished_at"),
                          EvaluationJob.status)
SUBMISSIONS = listing(SubmissionRow, SubmissionRow.created_at,
                      ("id", "run_id", "key_id", "track", "checkpoint_id", "model", "harness", "created_at"))
