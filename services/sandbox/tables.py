"""SQL tables of the sandbox service: one row per sandbox (its owner, the replica that runs it,
what it cost) and one lease per live sandbox-service replica (services/sandbox/replicas.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from storage.tables import Base, UTCDateTime, utcnow


class SandboxRow(Base):
    __tablename__ = "sandboxes"
    __table_args__ = (Index("ix_sandboxes_run_state", "run_id", "state"),
                      Index("ix_sandboxes_state_replica", "state", "replica"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40))
    key_id: Mapped[str] = mapped_column(String(40))
    chain_ids: Mapped[list[str]] = mapped_column(JSON)
    """The creator key and its ancestors, root first: the keys that may reach this sandbox."""
    owner_only: Mapped[bool] = mapped_column(default=False, server_default=false())
    """Reachable by the creator key alone, not its ancestors: a sandbox with a model door (an
    evaluation trial's, created with a platform-minted key) is the evaluation service's only."""
    template: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(16))
    backend_ref: Mapped[str | None] = mapped_column(String(200))
    """The backend's own id (E2B's sandbox id for the cloud backend)."""
    sandbox_metadata: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    internet: Mapped[bool] = mapped_column(default=False)
    state: Mapped[str] = mapped_column(String(16), default="running")
    """running → killed | timed_out | budget_exhausted | failed"""
    end_reason: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    end_at: Mapped[datetime] = mapped_column(UTCDateTime)
    """When the sandbox's timeout runs out (extended by set-timeout)."""
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost_nusd: Mapped[int] = mapped_column(BigInteger, default=0)
    price_nusd_per_s: Mapped[int] = mapped_column(BigInteger)
    replica: Mapped[str | None] = mapped_column(String(120))
    """The sandbox-service replica that runs it (:class:`SandboxReplica`); None: a row written
    before replicas were recorded."""
    slot_lease: Mapped[str | None] = mapped_column(String(40))
    """Its live-sandbox slot (billing/concurrency.py), given back by whoever ends it."""


class SandboxReplica(Base):
    """A live sandbox-service replica's lease, renewed while it runs: a replica whose lease ran
    out (or, on the same host, whose process is gone) is dead, and its sandboxes are reaped."""

    __tablename__ = "sandbox_replicas"

    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    """host:pid:random — one per process start, so a restarted replica is a new one."""
    host: Mapped[str] = mapped_column(String(200))
    """Hostname, boot and PID namespace (services/sandbox/replicas.py): where ``pid`` means something."""
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    """Renewed with every heartbeat by the replica's own lease length."""
