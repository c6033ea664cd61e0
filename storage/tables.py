"""SQL tables of the core (keys, ledger, concurrency slots).

Money columns are integer nano-USD. Check constraints repeat the ledger's invariants in the
database itself, so even a buggy caller cannot drive a balance below zero.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    TypeDecorator,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC, returns aware UTC — the same on SQLite and PostgreSQL."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return _naive_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)

    def bind_processor(self, dialect: Any) -> Any:
        """On SQLite, :meth:`process_bind_param` and SQLite ``DATETIME``'s text formatting fused
        into one call: the same text (``YYYY-MM-DD HH:MM:SS.ffffff``, which SQLite compares as
        strings), at under half the cost; the ledger binds three timestamps a reservation."""
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)
        return _sqlite_utc_text


def _naive_utc(value: datetime) -> datetime:
    """What the store keeps of an aware datetime: its UTC wall time (a naive one is refused)."""
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the store")
    return (value if value.tzinfo is UTC else value.astimezone(UTC)).replace(tzinfo=None)


def _sqlite_utc_text(value: datetime | None) -> str | None:
    if value is None:
        return None
    last = _LAST_TEXT[0]
    if last[0] is value:
        return last[1]
    # The fastest of the forms measured (C's isoformat; an aware UTC value's "+00:00" cut off).
    text = (value if value.tzinfo is UTC else _naive_utc(value)).isoformat(" ", "microseconds")[:26]
    _LAST_TEXT[0] = (value, text)
    return text


_LAST_TEXT: list[tuple[datetime | None, str]] = [(None, "")]
"""The last value :func:`_sqlite_utc_text` formatted, with its text (~1.1 µs each, a fifth of a
statement's binding): the ledger binds one ``now`` to both statements of a reservation and of a
settlement. Read and replaced whole (one tuple), so threads racing on it never pair a value with
another's text; the tuple's reference keeps the value alive, so ``is`` cannot match a new object."""


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ApiKey(Base):
    """A run key (root) or a child key minted by a run key for a research role."""

    __tablename__ = "api_keys"
    __table_args__ = (
        CheckConstraint("spent_nusd >= 0", name="spent_nonneg"),
        CheckConstraint("reserved_nusd >= 0", name="reserved_nonneg"),
        CheckConstraint(
            "budget_nusd IS NULL OR spent_nusd + reserved_nusd <= budget_nusd", name="within_budget"
        ),
        CheckConstraint("status IN ('active', 'paused', 'revoked')", name="status_known"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    root_id: Mapped[str] = mapped_column(String(40), index=True)
    parent_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), index=True)
    depth: Mapped[int] = mapped_column(Integer, default=0)
    name: Mapped[str | None] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_prefix: Mapped[str] = mapped_column(String(16))
    track: Mapped[str | None] = mapped_column(String(40))
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)
    budget_nusd: Mapped[int | None] = mapped_column(BigInteger)
    spent_nusd: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_nusd: Mapped[int] = mapped_column(BigInteger, default=0)
    status: Mapped[str] = mapped_column(String(16), default="active")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    agent_meter_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """Run keys: the run's agent-model meter (a root key of its own budget, gateway/agent_model.py)."""
    ends_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    """The run's wall-clock deadline (run keys; billing/deadlines.py). None: no deadline."""
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    """When a reaper ended the run (cancelled its jobs, killed its sandboxes) — claimed once."""
    task: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """Run keys the launcher minted: the task the run works on (``rsigym run start --task``)."""
    agent: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """… the research agent (its name in ops/agents.toml); reports group runs by it."""
    agent_version: Mapped[str | None] = mapped_column(String(80), nullable=True)
    """… its version (a pinned CLI's, or the gym's own package version for the gym's agents)."""
    agent_model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """… the agent-route model it was started with (None: it names none)."""
    end_reason: Mapped[str | None] = mapped_column(String(24), nullable=True)
    """Why the run ended, as the launcher recorded it (access/lifecycle.py END_REASONS); None: not
    recorded (a deadline that passed, or a run that has not ended)."""
    agent_exit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The agent process's exit status, when the launcher recorded one."""
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    """Launched runs: when the supervisor reported the agent started (None: ``created``, not yet)."""
    paused_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    """Run keys: since when the run is paused; its wall clock stands still until it resumes."""


class RunGeneration(Base):
    """A run started from an earlier run's accepted system (``rsigym run start --from RUN``,
    access/generations.py). Generation 0 is the base model with the minimal harness; a run
    started without ``--from`` is generation 1 and has no row here; a run started from a
    generation-N run is generation N + 1.

    The row is the cross-run grant ``--from`` makes: the new run may read and use
    ``initial_model`` (when it is a checkpoint) and ``initial_harness`` (when it is not the
    minimal harness), nothing more of the earlier run."""

    __tablename__ = "run_generations"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    """The new run (its root key id)."""
    from_run_id: Mapped[str] = mapped_column(String(40), index=True)
    """The earlier run whose scored, accepted final submission is this run's initial system."""
    chain_root_id: Mapped[str] = mapped_column(String(40), index=True)
    """The chain's generation-1 run (the first run of the chain, started without ``--from``)."""
    generation: Mapped[int] = mapped_column(Integer)
    submission_id: Mapped[str] = mapped_column(String(40))
    """``from_run_id``'s final submission (scored, its audit accepted)."""
    audit_id: Mapped[str] = mapped_column(String(40))
    """The audit of ``from_run_id`` that accepted that submission: the one the grant rests on."""
    initial_model: Mapped[str] = mapped_column(String(200))
    """The initial system's model: the submission's checkpoint id, or a base model's name."""
    initial_harness: Mapped[str] = mapped_column(String(200))
    """The initial system's harness: the submission's harness id, or ``minimal``."""
    initial_weights_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The initial checkpoint's weights hash (None: a base model)."""
    base_model: Mapped[str] = mapped_column(String(200))
    """Generation 0's base model: the chain's fixed base, the checkpoints' ``base_model``."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RateCounter(Base):
    """Tokens a key has reserved in one minute (billing/rate_limits.py)."""

    __tablename__ = "rate_counters"
    __table_args__ = (CheckConstraint("tokens >= 0", name="tokens_nonneg"),)

    key_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    """Minutes since the epoch (UTC)."""
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)


OPEN_ROW = text("status = 'reserved'")
"""A ledger row still held. Written out, not bound: a query must carry this very term for the
planner to use the partial index on open rows (a bound ``status = ?`` may be planned generically
on PostgreSQL, without it)."""
HAS_REF = text("ref_id IS NOT NULL")


class LedgerEntry(Base):
    """One reservation and its outcome: the itemized bill of a key."""

    __tablename__ = "ledger"
    __table_args__ = (
        CheckConstraint("estimate_nusd >= 0", name="estimate_nonneg"),
        CheckConstraint("actual_nusd IS NULL OR actual_nusd >= 0", name="actual_nonneg"),
        CheckConstraint(
            "status IN ('reserved', 'settled', 'released', 'expired')", name="status_known"
        ),
        # Each index is written by every reservation; these three are shaped so that a call
        # writes as few index entries, in as few places, as the reads below need (docs/performance.md,
        # "Ledger throughput"): a run's rows and a key's rows from one (run, key) index, not one each;
        # the reaper's open holds only while they are open (a settlement deletes its entry and
        # writes none); a job's holds only for rows that have a ref (gateway calls have none).
        Index("ix_ledger_run_key", "run_id", "key_id"),
        Index("ix_ledger_open_expires", "expires_at", sqlite_where=OPEN_ROW, postgresql_where=OPEN_ROW),
        Index("ix_ledger_ref_id", "ref_id", sqlite_where=HAS_REF, postgresql_where=HAS_REF),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    run_id: Mapped[str] = mapped_column(String(40))
    """The root of ``key_id``'s chain (its ``root_id``): a key's rows are read by (run, key)."""
    service: Mapped[str] = mapped_column(String(40))
    operation: Mapped[str] = mapped_column(String(80))
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """The model the call named (a catalogue model, a base model or a checkpoint id), for spend by
    model (/metrics, the admin ledger); None where the work names none (sandboxes, evaluation)."""
    ref_id: Mapped[str | None] = mapped_column(String(80))
    request_id: Mapped[str | None] = mapped_column(String(64))
    estimate_nusd: Mapped[int] = mapped_column(BigInteger)
    actual_nusd: Mapped[int | None] = mapped_column(BigInteger)
    overrun_nusd: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """What the real cost exceeded the reservation by (charged: never; recorded: always)."""
    status: Mapped[str] = mapped_column(String(16), default="reserved")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ConcurrencyCounter(Base):
    """How many calls of one key to one service are in flight right now."""

    __tablename__ = "concurrency"
    __table_args__ = (CheckConstraint("in_flight >= 0", name="in_flight_nonneg"),)

    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), primary_key=True)
    service: Mapped[str] = mapped_column(String(40), primary_key=True)
    in_flight: Mapped[int] = mapped_column(Integer, default=0)


class ConcurrencyLease(Base):
    """One held slot; lets the reaper give back slots of crashed holders."""

    __tablename__ = "concurrency_leases"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(40), index=True)
    service: Mapped[str] = mapped_column(String(40))
    chain: Mapped[list[str]] = mapped_column(JSON)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
