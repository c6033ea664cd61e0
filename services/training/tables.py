"""SQL tables of the training service: datasets, jobs and their steps.

Checkpoints are not here: training, inference and evaluation share one registry and its
table, in services/training/checkpoints.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from storage.tables import Base, UTCDateTime, utcnow


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("run_id", "sha256", name="uq_datasets_run_sha"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    key_id: Mapped[str] = mapped_column(String(40))
    name: Mapped[str | None] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    format: Mapped[str] = mapped_column(String(32))
    rows: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class TrainingJob(Base):
    __tablename__ = "training_jobs"
    __table_args__ = (Index("ix_training_jobs_status", "status"),
                      Index("ix_training_jobs_status_queue", "status", "queue"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    key_id: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(24), default="queued")
    base_model: Mapped[str] = mapped_column(String(200))
    parent_checkpoint_id: Mapped[str | None] = mapped_column(String(40))
    dataset_ids: Mapped[list[str]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_hash: Mapped[str] = mapped_column(String(64))
    loss_module_hash: Mapped[str | None] = mapped_column(String(64))
    experiment_id: Mapped[str | None] = mapped_column(String(40))
    """The experiment it attaches to (named by the caller, or implicit)."""
    total_steps: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer, default=0)
    cost_nusd: Mapped[int] = mapped_column(BigInteger, default=0)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    queue: Mapped[str] = mapped_column(String(40), default="training", server_default="training")
    """The Celery queue its task goes to (training, training-gpu, evaluation); also what queue metrics count."""
    worker: Mapped[str | None] = mapped_column(String(120))
    """The worker that claimed it (host:pid:nonce); only that worker may finish it while it runs."""
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """Renewed while the job runs; a stale one means its worker died (jobs/lifecycle.py)."""
    claims: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many times a worker has taken it (a resumed job is taken again)."""
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=utcnow)
    """When it last entered the queue (created, or re-queued); None on rows older than 0011: created_at."""
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When the fair scheduler handed it to a worker (jobs/lifecycle.py); None while it waits its turn."""
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TrainingStep(Base):
    __tablename__ = "training_steps"

    job_id: Mapped[str] = mapped_column(ForeignKey("training_jobs.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    loss: Mapped[float] = mapped_column(Float)
    lr: Mapped[float] = mapped_column(Float)
    tokens: Mapped[int] = mapped_column(Integer)
    grad_norm: Mapped[float] = mapped_column(Float)
    cost_nusd: Mapped[int] = mapped_column(BigInteger)
    cumulative_cost_nusd: Mapped[int] = mapped_column(BigInteger)
    loss_s: Mapped[float | None] = mapped_column(Float)
    """Wall seconds the custom loss ran this step (billed per second); None without one."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

