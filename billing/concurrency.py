"""Per-key, per-service concurrency caps that hold under races.

A slot is taken with a conditional ``UPDATE … SET in_flight = in_flight + 1 WHERE
in_flight < :cap`` on every capped key of the chain (root first), never check-then-insert,
and recorded as a lease so the reaper can give back slots of crashed holders.

Taking, extending and giving back a slot run on the store's hot path (``Store.begin``, statements
compiled once), as the ledger's reservations do: a sandbox create takes one, its end gives it back.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import cast

from sqlalchemy import Table, bindparam, delete, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from kit.errors import ConcurrencyLimited
from kit.ids import new_id
from storage.store import Store
from storage.tables import ConcurrencyCounter, ConcurrencyLease, UTCDateTime, utcnow

COUNTERS = cast(Table, ConcurrencyCounter.__table__)
LEASES = cast(Table, ConcurrencyLease.__table__)
_C, _L = COUNTERS.c, LEASES.c
_TAKE = (
    update(COUNTERS)
    .where(_C.key_id == bindparam("kid"), _C.service == bindparam("svc"), _C.in_flight < bindparam("cap"))
    .values(in_flight=_C.in_flight + 1)
    .returning(_C.in_flight)
)
_GIVE = (
    update(COUNTERS)
    .where(_C.key_id == bindparam("kid"), _C.service == bindparam("svc"))
    .values(in_flight=_C.in_flight - 1)
)
_COUNTER = {
    dialect: make(COUNTERS).values(key_id=bindparam("kid"), service=bindparam("svc"), in_flight=0).on_conflict_do_nothing()
    for dialect, make in (("sqlite", sqlite_insert), ("postgresql", pg_insert))
}
_LEASE = insert(LEASES)
_DROP = delete(LEASES).where(_L.id == bindparam("lid")).returning(_L.chain, _L.service)
_EXTEND = update(LEASES).where(_L.id == bindparam("lid")).values(
    expires_at=bindparam("until", type_=UTCDateTime()))


class ConcurrencySlots:
    def __init__(self, store: Store, lease_ttl_s: float = 900.0):
        self.store = store
        self.lease_ttl_s = lease_ttl_s

    def acquire(self, caps: list[tuple[str, int]], service: str, *, ttl_s: float | None = None) -> str | None:
        """Take one slot on every capped key of the chain; None when nothing is capped."""
        if not caps:
            return None
        lease_id = new_id("slot")
        with self.store.begin() as work:
            for key_id, cap in caps:
                took = work.first(_TAKE, {"kid": key_id, "svc": service, "cap": cap})
                if took is None:  # no counter yet (the key's first call), or the cap is reached
                    work.rows(_COUNTER[self.store.dialect], {"kid": key_id, "svc": service})
                    took = work.first(_TAKE, {"kid": key_id, "svc": service, "cap": cap})
                if took is None:
                    raise ConcurrencyLimited(
                        f"at most {cap} concurrent {service} calls for this key; retry when one finishes",
                        param=service,
                        headers={"Retry-After": "1"},
                    )
            work.rows(_LEASE, {"id": lease_id, "key_id": caps[-1][0], "service": service,
                               "chain": [key_id for key_id, _ in caps],
                               "expires_at": utcnow() + timedelta(seconds=ttl_s or self.lease_ttl_s)})
        return lease_id

    def release(self, lease_id: str | None) -> int:
        """Give back a lease's slots (1), or nothing when it is already gone (0): idempotent, so a
        holder and the reaper may both try."""
        if lease_id is None:
            return 0
        with self.store.begin() as work:
            dropped = work.first(_DROP, {"lid": lease_id})
            if dropped is None:
                return 0
            chain, service = dropped
            for key_id in json.loads(chain) if isinstance(chain, str) else chain:
                work.rows(_GIVE, {"kid": key_id, "svc": service})
        return 1

    def extend(self, lease_id: str | None, ttl_s: float) -> None:
        """Keep a long-held slot (a live sandbox) from being reclaimed as a crashed holder's."""
        if lease_id is None:
            return
        with self.store.begin() as work:
            work.rows(_EXTEND, {"lid": lease_id, "until": utcnow() + timedelta(seconds=ttl_s)})

    def in_flight(self, key_id: str, service: str) -> int:
        with self.store.transaction() as s:
            row = s.get(ConcurrencyCounter, (key_id, service))
            return 0 if row is None else row.in_flight

    def reclaim_expired(self) -> int:
        """Give back the slots of leases whose holders stopped extending them (crashed)."""
        with self.store.transaction() as s:
            ids = list(s.scalars(select(ConcurrencyLease.id).where(ConcurrencyLease.expires_at < utcnow())))
        return sum(self.release(lease_id) for lease_id in ids)
