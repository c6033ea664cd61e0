"""SQL tables of the records service: agent annotations, audit results and the live monitor's state.

Platform events and experiments live beside them (events.py, experiments.py): training,
evaluation, sandbox and the gateway write them in their own transactions. What is here is
written through the records service only: the agent's annotations (its claims, kept apart
from platform facts) and the operator's audit verdicts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from storage.tables import Base, UTCDateTime, utcnow


class Annotation(Base):
    """A hypothesis, claimed finding or review written by an agent key (never a platform fact)."""

    __tablename__ = "record_annotations"
    __table_args__ = (Index("ix_record_annotations_run_kind", "run_id", "kind"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40))
    key_id: Mapped[str] = mapped_column(String(40), index=True)
    """The (child) key that wrote it."""
    kind: Mapped[str] = mapped_column(String(16))
    """hypothesis | finding | review"""
    experiment_ids: Mapped[list[str]] = mapped_column(JSON, default=list)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditRow(Base):
    """One audit of a run: its verdict, hacking rate and the full report (JSON)."""

    __tablename__ = "audits"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    status: Mapped[str] = mapped_column(String(16))
    """accepted | flagged"""
    hacking_rate: Mapped[float | None] = mapped_column(Float)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class MonitorState(Base):
    """The live monitor's place in one run (services/records/monitor.py): the last agent turn it
    judged, and the claim of the replica checking it now (one check at a time, across replicas)."""

    __tablename__ = "monitor_state"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    """The newest agent turn (``agent_turns.seq``) judged so far (0: none)."""
    checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    checks: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(40), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(500), nullable=True)


class MonitorAlert(Base):
    """An EXECUTED behaviour the live monitor found in a run's new turns: the run was paused.
    The operator's only (never in the run's record chain, never shown to its keys)."""

    __tablename__ = "monitor_alerts"
    __table_args__ = (Index("ix_monitor_alerts_run_created", "run_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40))
    category: Mapped[str] = mapped_column(String(64))
    code: Mapped[str] = mapped_column(String(24))
    evidence: Mapped[str] = mapped_column(String(2000))
    """The judge's quote (an excerpt, secrets masked)."""
    judge_model: Mapped[str] = mapped_column(String(200))
    first_seq: Mapped[int] = mapped_column(BigInteger)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    """The new turns the check judged."""
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    """Whether this check paused the run (False: it was no longer active)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class IntegrityCheck(Base):
    """A check run while the run is live (services/records/live_integrity.py): a dataset's
    contamination scan at upload, or a submission's provenance. The operator's only: never in the
    run's record chain, never read by a route a run key reaches (the agent must not learn which of
    its rows are hidden tasks, nor see a run treated any differently for them)."""

    __tablename__ = "integrity_checks"
    __table_args__ = (Index("ix_integrity_checks_run_created", "run_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(16))
    """contamination | provenance"""
    subject: Mapped[str] = mapped_column(String(80))
    """The dataset (``ds_…``) or submission (``sub_…``) checked."""
    verdict: Mapped[str] = mapped_column(String(16))
    """pass | flag | inconclusive"""
    hits: Mapped[int] = mapped_column(Integer, default=0)
    """Contaminated tasks (contamination), EXECUTED findings (provenance)."""
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    """The operator's evidence: tasks and matched excerpts, or the provenance findings."""
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    """From the subject's registration to this row (the time to the flag)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
