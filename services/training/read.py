"""What other packages may read of training's store rows (the gateway's ``/admin/v1/runs/{id}/jobs``):
views, never the table classes, so training's tables stay its own."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.lifecycle import OPEN
from services.training.tables import TrainingJob


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
