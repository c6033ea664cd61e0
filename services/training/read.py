"""What other packages may read of training's store rows (the gateway's ``/admin/v1/runs/{id}/jobs``):
views, never the table classes, so training's tables stay its own."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.lifecycle import OPEN, finished_counts, queue_figures
from services.training.checkpoints import Checkpoint
from services.training.tables import Dataset, TrainingJob
from storage.pages import by_creation, listing, progress, view
from storage.store import Store


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


# -- what operators read (ops/: the dashboard, a run's timeline, the lists across runs) --------


@dataclass(frozen=True)
class JobView:
    """A training job as the operator's pages show it."""

    id: str
    run_id: str
    status: str
    queue: str
    base_model: str
    parent_checkpoint_id: str | None
    dataset_ids: list[str]
    step: int
    total_steps: int
    cost_nusd: int
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
    """Training jobs by creation time, of one run or all (``in_flight``: only queued and running
    ones, or with False only ended ones), in ``s``."""
    rows = by_creation(s, TrainingJob, run_id=run_id, newest_first=newest_first, limit=limit, in_flight=in_flight,
                       open_statuses=tuple(OPEN))
    return [view(JobView, r) for r in rows]


def running_by_queue(s: Session) -> dict[str, int]:
    """Queue → training jobs running on it, in ``s``."""
    rows = s.execute(select(TrainingJob.queue, func.count()).where(TrainingJob.status == "running")
                     .group_by(TrainingJob.queue)).tuples()
    return dict(rows.all())


@dataclass(frozen=True)
class JobTimes:
    """When a run's training jobs were first and last created and last finished (None: none was)."""

    first_created: datetime | None
    last_created: datetime | None
    last_finished: datetime | None


def job_times(s: Session, run_id: str) -> JobTimes:
    """The run's :class:`JobTimes` (its timeline), in ``s``."""
    first, last, finished = s.execute(
        select(func.min(TrainingJob.created_at), func.max(TrainingJob.created_at), func.max(TrainingJob.finished_at))
        .where(TrainingJob.run_id == run_id)).one()
    return JobTimes(first, last, finished)


@dataclass(frozen=True)
class DatasetView:
    """A dataset as a run's lineage shows it."""

    id: str
    name: str | None
    format: str
    rows: int


def run_datasets(s: Session, run_id: str) -> list[DatasetView]:
    """The run's datasets, oldest first, in ``s``."""
    rows = s.scalars(select(Dataset).where(Dataset.run_id == run_id).order_by(Dataset.created_at))
    return [view(DatasetView, r) for r in rows]


@dataclass(frozen=True)
class CheckpointView:
    """A checkpoint as a run's lineage shows it: the job that wrote it and its step."""

    id: str
    job_id: str
    step: int


def run_checkpoints(s: Session, run_id: str) -> list[CheckpointView]:
    """The run's checkpoints, oldest first, in ``s``."""
    rows = s.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.created_at))
    return [view(CheckpointView, r) for r in rows]


@dataclass(frozen=True)
class CheckpointFacts:
    """What the next generation records of a checkpoint it starts from."""

    id: str
    run_id: str
    base_model: str
    weights_hash: str


def checkpoint_facts(s: Session, ckpt_id: str) -> CheckpointFacts | None:
    """Any run's checkpoint ``ckpt_id`` (the operator's reads only), or None."""
    row = s.get(Checkpoint, ckpt_id)
    return None if row is None else view(CheckpointFacts, row)


DATASETS = listing(Dataset, Dataset.created_at,
                   ("id", "run_id", "key_id", "name", "sha256", "format", "rows", "bytes", "created_at"))
TRAINING_JOBS = listing(TrainingJob, TrainingJob.created_at,
                        ("id", "run_id", "key_id", "status", "base_model", "parent_checkpoint_id", "dataset_ids",
                         "config_hash", "loss_module_hash", "experiment_id", "step", "total_steps", "cost_nusd",
                         "error", "created_at", "started_at", "finished_at"),
                        TrainingJob.status)
CHECKPOINTS = listing(Checkpoint, Checkpoint.created_at,
                      ("id", "run_id", "job_id", "base_model", "parent_checkpoint_id", "dataset_hashes",
                       "config_hash", "loss_module_hash", "step", "weights_hash", "experiment_id", "created_at"))
