"""SQL tables of the records service: agent annotations and audit results.

Platform events and experiments live beside them (events.py, experiments.py): training,
evaluation, sandbox and the gateway write them in their own transactions. What is here is
written through the records service only: the agent's annotations (its claims, kept apart
from platform facts) and the operator's audit verdicts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, Index, String
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
