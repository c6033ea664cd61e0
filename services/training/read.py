"""What other packages may read of training's store rows (the gateway's ``/admin/v1/runs/{id}/jobs``):
views, never the table classes, so training's tables stay its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.lifecycle import OPEN, finished_counts, queue_figures
from services.training.tables import TrainingJob
from storage.store import Store


def progress(done: int, total: int) -> float | None:
    """A job's fraction done; None when its size is unknown."""
    return None if total <= 0 else min(1.0, done / total)


def unfinished_jobs(s: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's queued and running training jobs, in the session ``s``."""
    jobs = s.scalars(select(TrainingJob).where(TrainingJob.run_id == run_id, TrainingJob.status.in_(OPEN)))
    return [{"id": job.id, "kind": "training", "status": job.status, "model": job.base_model,
             "done": job.step, "total": job.total_steps, "progress": progress(job.step, job.total_steps),
             "created_at": job.created_at.isoformat(),
             "started_at": job.started_at.isoformat() if job.started_at else None}
            for job in jobs]


@dataclass(frozen=True)
class JobRequest:
    """What a training job was asked for, as its row keeps it (the records' loss audit)."""

    id: str
    base_model: str
    experiment_id: str | None
    config: dict[str, Any]
    loss_module_hash: str | None


def run_jobs(s: Session, run_id: str) -> list[JobRequest]:
    """Every training job of the run, oldest first (ties by id), in the session ``s``."""
    rows = s.scalars(select(TrainingJob).where(TrainingJob.run_id == run_id)
                     .order_by(TrainingJob.created_at, TrainingJob.id))
    return [JobRequest(r.id, r.base_model, r.experiment_id, dict(r.config or {}), r.loss_module_hash) for r in rows]


def job_configs(s: Session, run_id: str, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The recorded config of each of the run's jobs in ``job_ids`` (the records' experiment diff: the
    event carries only its hash), in ``s``."""
    if not job_ids:
        return {}
    rows = s.scalars(select(TrainingJob).where(TrainingJob.id.in_(job_ids), TrainingJob.run_id == run_id))
    return {r.id: dict(r.config or {}) for r in rows}


def job_queues(store: Store) -> dict[str, tuple[int, float]]:
    """Queue → (training jobs waiting, age in seconds of the oldest), every known queue listed (the
    gateway's job gauges)."""
    return queue_figures(store, [TrainingJob])


def finished_jobs(store: Store) -> dict[tuple[str, str], int]:
    """("training", final status) → training jobs that ended so (the gateway's job gauges)."""
    return finished_counts(store, {"training": TrainingJob})
