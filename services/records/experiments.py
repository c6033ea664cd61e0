"""Experiments: the nodes of a run's research graph (RSI-Master), each owned by one key.

A node is (θ_in, action, θ_out, evaluation): what it started from (a base model or checkpoint
and a harness), what was done (a training job, an evaluation), what came out (checkpoints) and
how it scored. The *facts* of a node are the platform events attached to it
(services/records/events.py); this table holds only its identity, owner, edges and integrity
status, which audits set (``pending`` → ``accepted`` | ``flagged`` with reasons).

Training and evaluation calls name an experiment (``experiment`` field) or get an implicit
one. A node continues the experiment that produced the checkpoint it starts from, so lineage
needs no claim from the agent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Index, String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from kit.errors import NotFound, PermissionDenied
from kit.ids import new_id
from services.records.events import EXPERIMENT_CREATED, EventLog
from storage.tables import Base, UTCDateTime, utcnow

STATUSES = ("pending", "accepted", "flagged")


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = (Index("ix_experiments_run_owner", "run_id", "owner_key_id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    owner_key_id: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(200))
    implicit: Mapped[bool] = mapped_column(Boolean, default=False)
    """Made by the platform for an action that named no experiment."""
    status: Mapped[str] = mapped_column(String(16), default="pending")
    reasons: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    audited_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ExperimentEdge(Base):
    """``child`` continues ``parent`` (an experiment may continue several)."""

    __tablename__ = "experiment_edges"

    child_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    parent_id: Mapped[str] = mapped_column(String(40), primary_key=True, index=True)


def experiment_row_view(e: Experiment, parents: list[str]) -> dict[str, Any]:
    return {"id": e.id, "object": "experiment", "run_id": e.run_id, "owner_key_id": e.owner_key_id, "name": e.name,
            "implicit": e.implicit, "parents": parents, "status": e.status, "reasons": list(e.reasons or []),
            "created_at": e.created_at.isoformat(), "audited_at": e.audited_at.isoformat() if e.audited_at else None}


class ExperimentRegistry:
    """Creating experiments and attaching platform actions to them; used by training,
    evaluation and records alike (no service reads another's tables)."""

    def __init__(self, events: EventLog):
        self.events = events

    def create(self, s: Session, *, run_id: str, owner_key_id: str, name: str, parents: list[str],
               implicit: bool) -> Experiment:
        """A new node (``parents``: experiments of this run it continues, checked here)."""
        for parent in dict.fromkeys(parents):
            row = s.get(Experiment, parent)
            if row is None or row.run_id != run_id:
                raise NotFound(f"experiment {parent} not found", param="parents")
        exp = Experiment(id=new_id("exp"), run_id=run_id, owner_key_id=owner_key_id, name=name[:200],
                         implicit=implicit, status="pending", reasons=[])
        s.add(exp)
        for parent in dict.fromkeys(parents):
            s.add(ExperimentEdge(child_id=exp.id, parent_id=parent))
        s.flush()
        self.events.append(s, run_id=run_id, kind=EXPERIMENT_CREATED, key_id=owner_key_id, experiment_id=exp.id,
                           data={"experiment_id": exp.id, "name": exp.name, "parents": list(dict.fromkeys(parents)),
                                 "implicit": implicit})
        return exp

    def resolve(self, s: Session, *, run_id: str, key_id: str, experiment_id: str | None, name: str,
                continues: list[str] | None = None) -> str:
        """The experiment an action attaches to: the one named (it must be this key's own), or
        a new implicit one continuing ``continues`` (the producers of its inputs)."""
        if experiment_id is not None:
            row = s.get(Experiment, experiment_id) if isinstance(experiment_id, str) else None
            if row is None or row.run_id != run_id:
                raise NotFound(f"experiment {experiment_id} not found", param="experiment")
            if row.owner_key_id != key_id:
                raise PermissionDenied(f"experiment {experiment_id} belongs to another key; actions attach only "
                                       "to the caller's own experiments", param="experiment")
            for parent in continues or []:
                if parent != row.id and s.get(ExperimentEdge, (row.id, parent)) is None:
                    s.add(ExperimentEdge(child_id=row.id, parent_id=parent))
            return row.id
        return self.create(s, run_id=run_id, owner_key_id=key_id, name=name,
                           parents=[p for p in continues or [] if p], implicit=True).id

    @staticmethod
    def parents_of(s: Session, experiment_id: str) -> list[str]:
        return list(s.scalars(select(ExperimentEdge.parent_id).where(ExperimentEdge.child_id == experiment_id)
                              .order_by(ExperimentEdge.parent_id)))
