"""What other packages may read of evaluation's store rows: a run's jobs in flight (the gateway's
``/admin/v1/runs/{id}/jobs``) and where the registered benchmarks are (the records' contamination
audit) — views, never the table classes, so evaluation's tables stay its own. Light: the gateway
imports it (no harbor)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.evaluation.tables import BenchmarkRow, EvaluationJob
from jobs.lifecycle import OPEN
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
