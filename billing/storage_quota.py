"""Per-run storage quota: what a run keeps on the gym's disk, metered at write time.

Every service that writes a run's bytes to disk (training: datasets and checkpoints;
evaluation: harness archives and their unpacked trees) goes through :class:`StorageQuota`:

* :meth:`StorageQuota.check_object` refuses one object over its per-object limit (413
  ``payload_too_large``) before anything is written;
* :meth:`StorageQuota.require` refuses early (403 ``quota_exceeded``) what cannot fit in what the
  run has left, so a harness archive that *unpacks* past the quota is refused after its headers
  are read and before one byte of it is extracted;
* :meth:`StorageQuota.charge` adds the bytes actually written to the run's usage with one
  conditional ``UPDATE … WHERE used_bytes + :n <= :quota`` in the caller's transaction (the same
  statement on SQLite and PostgreSQL, as the ledger's reservations), so two concurrent uploads
  can never both pass the quota; the caller commits its own row in that transaction, and on a
  refusal removes what it wrote.

Sizes are the stored (expanded) sizes: a harness counts its archive plus its unpacked tree, a
checkpoint its files. Content shared on disk between runs (the same dataset uploaded by two
runs) is charged to each run that registered it: a run's quota never depends on another run.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import BigInteger, CheckConstraint, Integer, String, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, Session, mapped_column

from kit.errors import PayloadTooLarge, QuotaExceeded
from storage.store import Store
from storage.tables import Base, UTCDateTime, utcnow

MiB = 2**20
Kind = Literal["datasets", "harnesses", "checkpoints", "trajectories", "results"]
KINDS: tuple[Kind, ...] = ("datasets", "harnesses", "checkpoints", "trajectories", "results")
_WHAT = {"datasets": "dataset", "harnesses": "harness", "checkpoints": "checkpoint",
         "trajectories": "trajectory", "results": "evaluation result"}


class RunStorage(Base):
    """One run's stored bytes, in total and by kind."""

    __tablename__ = "run_storage"
    __table_args__ = tuple(CheckConstraint(f"{c} >= 0", name=f"{c}_nonneg")
                           for c in ("used_bytes", "objects", *(f"{k}_bytes" for k in KINDS)))

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    used_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    objects: Mapped[int] = mapped_column(Integer, default=0)
    datasets_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    harnesses_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    checkpoints_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    trajectories_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    results_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (or of ``path`` itself), each inode once,
    symlinks not followed: what the tree holds on disk, however it was linked."""
    if path.is_file() and not path.is_symlink():
        return path.stat().st_size
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_mode & 0o170000) == 0o100000 and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _mb(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


class StorageQuota:
    """The run storage meter. ``quota_bytes`` per run, ``max_object_bytes`` per object."""

    def __init__(self, store: Store, quota_bytes: int, max_object_bytes: int):
        self.store = store
        self.quota_bytes = quota_bytes
        self.max_object_bytes = max_object_bytes

    @classmethod
    def of(cls, context: Any) -> StorageQuota:
        """The gym's meter (a ``ServiceContext``: its store and ``[storage]`` config)."""
        cfg = context.config.storage
        return cls(context.store, cfg.run_quota_mb * MiB, cfg.max_object_mb * MiB)

    # -- before writing ----------------------------------------------------------------

    def check_object(self, kind: Kind, nbytes: int, *, limit: int | None = None, param: str | None = "body") -> None:
        """413 when one object is over its limit (``limit``: the kind's own, when tighter)."""
        cap = self.max_object_bytes if limit is None else min(limit, self.max_object_bytes)
        if nbytes > cap:
            raise PayloadTooLarge(f"this {_WHAT[kind]} is {nbytes} bytes ({_mb(nbytes)}); one {_WHAT[kind]} may "
                                  f"hold at most {cap} bytes ({_mb(cap)})", param=param)

    def require(self, run_id: str, kind: Kind, nbytes: int, *, param: str | None = "body") -> None:
        """403 ``quota_exceeded`` when ``nbytes`` more cannot fit in what the run has left now
        (a check before writing; :meth:`charge` is the one that holds under concurrency)."""
        used = self.used(run_id)
        if used + nbytes > self.quota_bytes:
            raise self._exceeded(kind, nbytes, used, param)

    def used(self, run_id: str) -> int:
        with self.store.transaction() as s:
            return s.scalar(select(RunStorage.used_bytes).where(RunStorage.run_id == run_id)) or 0

    # -- with the write ----------------------------------------------------------------

    def charge(self, s: Session, run_id: str, kind: Kind, nbytes: int, *, param: str | None = "body") -> None:
        """Add ``nbytes`` of ``kind`` to the run's usage in the caller's transaction, or raise
        ``quota_exceeded`` (the caller's transaction then rolls back and it removes its bytes)."""
        if nbytes < 0:
            raise ValueError("a charge is never negative")
        self._ensure_row(s, run_id)
        column = getattr(RunStorage, f"{kind}_bytes")
        result = s.execute(
            update(RunStorage)
            .where(RunStorage.run_id == run_id, RunStorage.used_bytes + nbytes <= self.quota_bytes)
            .values({RunStorage.used_bytes: RunStorage.used_bytes + nbytes, column: column + nbytes,
                     RunStorage.objects: RunStorage.objects + 1, RunStorage.updated_at: utcnow()})
            .execution_options(synchronize_session=False)
        )
        if getattr(result, "rowcount", 0) != 1:
            used = s.scalar(select(RunStorage.used_bytes).where(RunStorage.run_id == run_id)) or 0
            raise self._exceeded(kind, nbytes, used, param)

    def release(self, s: Session, run_id: str, kind: Kind, nbytes: int) -> None:
        """Give back what a deleted object held (never below zero)."""
        column = getattr(RunStorage, f"{kind}_bytes")
        s.execute(
            update(RunStorage)
            .where(RunStorage.run_id == run_id, RunStorage.used_bytes >= nbytes, column >= nbytes,
                   RunStorage.objects >= 1)
            .values({RunStorage.used_bytes: RunStorage.used_bytes - nbytes, column: column - nbytes,
                     RunStorage.objects: RunStorage.objects - 1, RunStorage.updated_at: utcnow()})
            .execution_options(synchronize_session=False)
        )

    # -- reading -----------------------------------------------------------------------

    def usage(self, run_id: str) -> dict[str, Any]:
        """The run's usage as the balance route shows it."""
        with self.store.transaction() as s:
            row = s.get(RunStorage, run_id)
            by_kind = {k: (getattr(row, f"{k}_bytes") if row else 0) for k in KINDS}
            used = row.used_bytes if row else 0
            objects = row.objects if row else 0
        return {"used_bytes": used, "quota_bytes": self.quota_bytes, "remaining_bytes": max(self.quota_bytes - used, 0),
                "max_object_bytes": self.max_object_bytes, "objects": objects, "by_kind": by_kind}

    # -- internals ---------------------------------------------------------------------

    def _exceeded(self, kind: Kind, nbytes: int, used: int, param: str | None) -> QuotaExceeded:
        return QuotaExceeded(
            f"storing this {_WHAT[kind]} ({nbytes} bytes, {_mb(nbytes)}) would take the run past its storage quota: "
            f"{used} of {self.quota_bytes} bytes ({_mb(used)} of {_mb(self.quota_bytes)}) are used; nothing was stored",
            param=param)

    @staticmethod
    def _ensure_row(s: Session, run_id: str) -> None:
        dialect = s.get_bind().dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        values = {"run_id": run_id, "used_bytes": 0, "objects": 0, "updated_at": utcnow(),
                  **{f"{k}_bytes": 0 for k in KINDS}}
        s.execute(insert(RunStorage).values(values).on_conflict_do_nothing(index_elements=["run_id"]))
