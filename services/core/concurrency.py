"""Per-key, per-service concurrency caps that hold under races.

A slot is taken with a conditional ``UPDATE … SET in_flight = in_flight + 1 WHERE
in_flight < :cap`` on every capped key of the chain (root first), never check-then-insert,
and recorded as a lease so the reaper can give back slots of crashed holders.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from services.core.errors import ConcurrencyLimited
from services.core.ids import new_id
from services.core.store import Store
from services.core.tables import ConcurrencyCounter, ConcurrencyLease, utcnow


class ConcurrencySlots:
    def __init__(self, store: Store, lease_ttl_s: float = 900.0):
        self.store = store
        self.lease_ttl_s = lease_ttl_s

    def acquire(self, caps: list[tuple[str, int]], service: str, *, ttl_s: float | None = None) -> str | None:
        """Take one slot on every capped key of the chain; None when nothing is capped."""
        if not caps:
            return None
        insert = pg_insert if self.store.dialect == "postgresql" else sqlite_insert
        with self.store.transaction() as s:
            for key_id, cap in caps:
                s.execute(
                    insert(ConcurrencyCounter)
                    .values(key_id=key_id, service=service, in_flight=0)
                    .on_conflict_do_nothing()
                )
                took = s.execute(
                    update(ConcurrencyCounter)
                    .where(
                        ConcurrencyCounter.key_id == key_id,
                        ConcurrencyCounter.service == service,
                        ConcurrencyCounter.in_flight < cap,
                    )
                    .values(in_flight=ConcurrencyCounter.in_flight + 1)
                    .execution_options(synchronize_session=False)
                )
                if cast(CursorResult[Any], took).rowcount != 1:  # SQLAlchemy 2.1 types execute() as Result
                    raise ConcurrencyLimited(
                        f"at most {cap} concurrent {service} calls for this key; retry when one finishes",
                        param=service,
                        headers={"Retry-After": "1"},
                    )
            lease = ConcurrencyLease(
                id=new_id("slot"),
                key_id=caps[-1][0],
                service=service,
                chain=[key_id for key_id, _ in caps],
                expires_at=utcnow() + timedelta(seconds=ttl_s or self.lease_ttl_s),
            )
            s.add(lease)
        return lease.id

    def release(self, lease_id: str | None) -> None:
        if lease_id is None:
            return
        with self.store.transaction() as s:
            self._drop(s, lease_id)

    def extend(self, lease_id: str | None, ttl_s: float) -> None:
        """Keep a long-held slot (a live sandbox) from being reclaimed as a crashed holder's."""
        if lease_id is None:
            return
        with self.store.transaction() as s:
            s.execute(update(ConcurrencyLease).where(ConcurrencyLease.id == lease_id)
                      .values(expires_at=utcnow() + timedelta(seconds=ttl_s)))

    def in_flight(self, key_id: str, service: str) -> int:
        with self.store.transaction() as s:
            row = s.get(ConcurrencyCounter, (key_id, service))
            return 0 if row is None else row.in_flight

    def reclaim_expired(self) -> int:
        with self.store.transaction() as s:
            ids = s.scalars(select(ConcurrencyLease.id).where(ConcurrencyLease.expires_at < utcnow())).all()
            return sum(self._drop(s, lease_id) for lease_id in ids)

    @staticmethod
    def _drop(s: Session, lease_id: str) -> int:
        chain = s.execute(
            delete(ConcurrencyLease).where(ConcurrencyLease.id == lease_id).returning(ConcurrencyLease.chain, ConcurrencyLease.service)
        ).first()
        if chain is None:
            return 0
        keys, service = chain
        for key_id in keys:
            s.execute(
                update(ConcurrencyCounter)
                .where(ConcurrencyCounter.key_id == key_id, ConcurrencyCounter.service == service)
                .values(in_flight=ConcurrencyCounter.in_flight - 1)
                .execution_options(synchronize_session=False)
            )
        return 1
