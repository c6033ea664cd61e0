"""What other packages may read of evaluation's store rows: a run's jobs in flight (the gateway's
``/admin/v1/runs/{id}/jobs``) and where the registered benchmarks are (the records' contamination
audit) — views, never the table classes, so evaluation's tables stay its own. Light: the gateway
imports it (no harbor)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.lifecycle import OPEN, finished_counts, queue_figures
from services.evaluation.tables import BenchmarkRow, EvaluationJob, HarnessRow, ScoreRow, TrialResultRow
from services.training.read import progress
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
                           ScoreRow.benchmark == benchmark, ScoreRow.split.in_(splits),
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
