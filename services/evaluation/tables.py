"""SQL tables of the evaluation service.

Benchmarks are registered by operators; harness archives are uploaded by runs; jobs hold
one evaluation (benchmark × split × model × harness × attempts) and their results, one row
per task and attempt, written as each trial ends so partial results survive a cancel or a
crash. Submissions, scores and the cached initial-system baselines are what `rsigym score`
and `rsigym report` read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from storage.tables import Base, UTCDateTime, utcnow


class BenchmarkRow(Base):
    __tablename__ = "benchmarks"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    version: Mapped[str] = mapped_column(String(40))
    description: Mapped[str] = mapped_column(Text, default="")
    path: Mapped[str] = mapped_column(Text)
    splits: Mapped[dict[str, Any]] = mapped_column(JSON)
    """split → {"hidden": bool, "tasks": int}"""
    validation: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    training_pool: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, default=None)
    """{"path": relative to ``path``, "rows": int, "sha256": hex} when the benchmark ships a pool."""


class HarnessRow(Base):
    __tablename__ = "harnesses"
    __table_args__ = (UniqueConstraint("run_id", "sha256", name="uq_harnesses_run_sha"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    key_id: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(128))
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(Integer)
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class EvaluationJob(Base):
    __tablename__ = "evaluation_jobs"
    __table_args__ = (Index("ix_evaluation_jobs_status", "status"),
                      Index("ix_evaluation_jobs_status_queue", "status", "queue"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    """The run evaluated (for scoring jobs: the scored run, billed to the operator)."""
    key_id: Mapped[str] = mapped_column(String(40))
    """The key the job's sandboxes and tokens are billed under (run key, or the operator's)."""
    purpose: Mapped[str] = mapped_column(String(16), default="agent")
    """agent | score | baseline | validation"""
    benchmark: Mapped[str] = mapped_column(String(100))
    split: Mapped[str] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    harness: Mapped[str] = mapped_column(String(40))
    """"minimal" or a harness id."""
    attempts: Mapped[int] = mapped_column(Integer)
    sampling: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    task_ids: Mapped[list[str]] = mapped_column(JSON)
    experiment_id: Mapped[str | None] = mapped_column(String(40))
    """The experiment it attaches to (agent jobs: named by the caller, or implicit)."""
    gateway_url: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(24), default="queued")
    """queued → running → succeeded | failed | cancelled"""
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    queue: Mapped[str] = mapped_column(String(40), default="evaluation", server_default="evaluation")
    """The Celery queue its task goes to (training, training-gpu, evaluation); also what queue metrics count."""
    worker: Mapped[str | None] = mapped_column(String(120))
    """The worker that claimed it (host:pid:nonce); only that worker may finish it while it runs."""
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """Renewed while the job runs; a stale one means its worker died (jobs/lifecycle.py)."""
    claims: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many times a worker has taken it (a resumed job is taken again)."""
    trials_total: Mapped[int] = mapped_column(Integer)
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    score: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=utcnow)
    """When it last entered the queue (created, or re-queued); None on rows older than 0011: created_at."""
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When the fair scheduler handed it to a worker (jobs/lifecycle.py); None while it waits its turn."""
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TrialResultRow(Base):
    __tablename__ = "evaluation_results"
    __table_args__ = (UniqueConstraint("job_id", "task_id", "attempt", name="uq_evaluation_results_trial"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40), index=True)
    task_id: Mapped[str] = mapped_column(String(100))
    attempt: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    failure_kind: Mapped[str | None] = mapped_column(String(16), nullable=True, default=None)
    """platform | verifier | agent when the trial failed (services/evaluation/failures.py): only an
    agent failure is the system under test's 0; None on a trial that did not fail (and rows before 0018)."""
    trajectory: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    verifier_output: Mapped[str] = mapped_column(Text, default="")
    agent_output: Mapped[str] = mapped_column(Text, default="")
    sandbox_id: Mapped[str | None] = mapped_column(String(40))
    started_at: Mapped[str | None] = mapped_column(String(40))
    finished_at: Mapped[str | None] = mapped_column(String(40))
    judge: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, default=None)
    """A judged benchmark's trial: ``{model, calls, prompts: [{path, model, messages}], truncated}``,
    what its verifier asked the judge (kept at the judge's door, bounded: services/sandbox/door.py);
    None otherwise (and on rows before 0020)."""


class TrialClaim(Base):
    """A trial some worker is running now. Several workers may share one evaluation job: each
    takes a trial by inserting its claim (the primary key admits one), renews ``heartbeat_at``
    while it runs, and deletes the claim when it writes the result. A stale claim (its worker
    died) is dropped by the job's owner and the trial runs again."""

    __tablename__ = "evaluation_trial_claims"

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker: Mapped[str] = mapped_column(String(120))
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SubmissionRow(Base):
    __tablename__ = "submissions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    key_id: Mapped[str] = mapped_column(String(40))
    track: Mapped[str | None] = mapped_column(String(16))
    checkpoint_id: Mapped[str | None] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    """What is evaluated: the checkpoint id, or the base model when the track keeps it."""
    harness: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ScoreRow(Base):
    __tablename__ = "scores"
    __table_args__ = (Index("ix_scores_run_benchmark", "run_id", "benchmark"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40))
    """The scored run, "initial" for the initial system's baseline, or "reference" for a reference
    system (a base model with the minimal harness, shown next to the initial one)."""
    submission_id: Mapped[str | None] = mapped_column(String(40))
    benchmark: Mapped[str] = mapped_column(String(100))
    split: Mapped[str] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    harness: Mapped[str] = mapped_column(String(40))
    attempts: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str] = mapped_column(String(40))
    score: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(24), default="running")
    agent: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    subset: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    """How many of the split's tasks were scored (services/evaluation/subsets.py); None: all of them."""
    subset_seed: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    """The seed that drew the subset (None without a subset)."""
    split_seed: Mapped[str | None] = mapped_column(String(120), nullable=True, default=None)
    """The seed that drew the split, by name (``gym seed <fingerprint>``, ``split_seed 17``); None
    for a fixed split (and rows before 0019)."""
    cell: Mapped[str | None] = mapped_column(String(16), nullable=True, default=None)
    """A decomposition cell of the run's score (``rsigym score --decompose``,
    services/evaluation/decompose.py): ``model`` (submitted model × minimal harness) or ``harness``
    (base model × submitted harness). None on the run's own score, the baselines (and rows before
    0024): a reader of *the* run's score leaves cells out."""
