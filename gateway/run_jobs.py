"""A run's unfinished jobs — training and evaluation rows still ``queued`` or ``running`` —
read straight from the store for ``GET /admin/v1/runs/{run_id}/jobs`` (``rsigym watch``).

The records API only sees a job once it finishes (its ``training.job`` / ``evaluation.job``
event), so the jobs in flight come from the job tables. Scoring jobs the operator started for
the run (``purpose`` ``score``) carry the run's id too and are listed with their purpose.
Nothing here writes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from kit.errors import NotFound
from storage.store import Store
from storage.tables import ApiKey
from services.evaluation.tables import EvaluationJob
from services.training.tables import TrainingJob

UNFINISHED = ("queued", "running")


def _progress(done: int, total: int) -> float | None:
    return None if total <= 0 else min(1.0, done / total)


def _training_view(job: TrainingJob) -> dict[str, Any]:
    return {"id": job.id, "kind": "training", "status": job.status, "model": job.base_model,
            "done": job.step, "total": job.total_steps, "progress": _progress(job.step, job.total_steps),
            "created_at": job.created_at.isoformat(),
            "started_at": job.started_at.isoformat() if job.started_at else None}


def _evaluation_view(job: EvaluationJob) -> dict[str, Any]:
    return {"id": job.id, "kind": "evaluation", "status": job.status, "model": job.model,
            "benchmark": job.benchmark, "purpose": job.purpose,
            "done": job.trials_done, "total": job.trials_total, "progress": _progress(job.trials_done, job.trials_total),
            "created_at": job.created_at.isoformat(),
            "started_at": job.started_at.isoformat() if job.started_at else None}


def running_jobs(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's queued and running jobs, oldest first; 404 for a child key or an unknown id."""
    with store.transaction() as s:
        key = s.get(ApiKey, run_id)
        if key is None or key.parent_id is not None:
            raise NotFound(f"run {run_id} not found", param="run_id")
        training = s.scalars(select(TrainingJob).where(TrainingJob.run_id == run_id,
                                                       TrainingJob.status.in_(UNFINISHED))).all()
        evaluation = s.scalars(select(EvaluationJob).where(EvaluationJob.run_id == run_id,
                                                           EvaluationJob.status.in_(UNFINISHED))).all()
        views = [_training_view(j) for j in training] + [_evaluation_view(j) for j in evaluation]
    return sorted(views, key=lambda v: (v["created_at"], v["id"]))
