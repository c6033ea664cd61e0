"""The ledger: reserve the worst case before work, settle the truth after.

Every money movement is a conditional ``UPDATE`` whose ``WHERE`` clause *is* the budget
check, e.g.::

    UPDATE api_keys SET reserved_nusd = reserved_nusd + :x
    WHERE id = :k AND status = 'active'
      AND (budget_nusd IS NULL OR budget_nusd - spent_nusd - reserved_nusd >= :x)

so the check and the hold cannot be separated by a concurrent call, on SQLite (database
write lock) and on PostgreSQL (row lock, re-evaluated after the wait) alike. A call by a
child key moves money on every key of its chain, root first (one lock order for all
callers, so no deadlocks), inside one transaction.

A settlement is never charged above its reservation, so no budget is ever exceeded. When the
real cost is higher (a provider billed more than its bound), the difference is the row's
``overrun_nusd`` and a warning: the key paid its reservation, the operator sees the rest.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    CursorResult,
    Select,
    String,
    Table,
    Update,
    and_,
    bindparam,
    case,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.orm import Session

from billing.money import format_usd, nusd_to_usd
from kit.config import LedgerConfig
from kit.errors import BudgetExhausted, KeyPaused, KeyRevoked, NotFound
from kit.ids import new_ordered_id
from storage.group_commit import Pipelined
from storage.store import Store, Work
from storage.tables import OPEN_ROW, ApiKey, LedgerEntry, UTCDateTime, utcnow

log = logging.getLogger("rsigym.ledger")


class Reservation(NamedTuple):
    """A hold taken (:meth:`Ledger.reserve`). Immutable values, as the balance below; named
    tuples because one of each is made on every metered call, at a quarter of a frozen
    dataclass's cost (whose ``__init__`` sets each field through ``object.__setattr__``)."""

    id: str
    key_id: str
    run_id: str
    estimate_nusd: int
    service: str
    operation: str
    balance: Balance | None = None
    """The key's balance right after the hold was taken."""


class Balance(NamedTuple):
    """A key's figures (see :class:`Reservation` for why a named tuple)."""

    budget_nusd: int
    spent_nusd: int
    reserved_nusd: int
    remaining_nusd: int

    def as_usd(self) -> dict[str, float]:
        return {
            "budget_usd": nusd_to_usd(self.budget_nusd),
            "spent_usd": nusd_to_usd(self.spent_nusd),
            "reserved_usd": nusd_to_usd(self.reserved_nusd),
            "remaining_usd": nusd_to_usd(self.remaining_nusd),
        }

    @property
    def remaining_header(self) -> str:
        return format_usd(self.remaining_nusd)


def chain_of(session: Session, key_id: str) -> list[ApiKey]:
    """The key and its ancestors, root first."""
    chain: list[ApiKey] = []
    current: str | None = key_id
    while current is not None:
        row = session.get(ApiKey, current)
        if row is None:
            raise NotFound(f"key {key_id} not found")
        chain.append(row)
        current = row.parent_id
    chain.reverse()
    return chain


Figures = tuple[int | None, int, int]
"""(budget, spent, reserved) of one key."""
Closed = tuple[tuple[Any, ...], list[Figures]]
"""A closed reservation's row (key, run, estimate, charged, overrun, service, operation) and its chain's figures."""


def balance_of(chain: list[ApiKey]) -> Balance:
    return balance_from([(k.budget_nusd, k.spent_nusd, k.reserved_nusd) for k in chain])


def balance_from(chain: list[Figures]) -> Balance:
    """Figures of the binding account: the nearest key (self, then up) that has a budget;
    remaining is the least remaining over the whole chain (root first)."""
    if len(chain) == 1:  # a run key on its own: most calls
        only, spent, reserved = chain[0]
        if only is not None:
            return Balance(only, spent, reserved, max(only - spent - reserved, 0))
    budgeted = [f for f in chain if f[0] is not None]
    budget, spent, reserved = budgeted[-1]
    remaining = min(b - s - r for b, s, r in budgeted)  # type: ignore[operator]
    return Balance(budget or 0, spent, reserved, max(remaining, 0))


# -- the hot path's statements ------------------------------------------------------------
# Built once, with bind parameters only: each store compiles them once (Store.prepared) and
# every call just binds values and runs them on the driver's cursor (Store.begin), with no ORM
# session, unit of work or per-statement engine machinery in between. Every bind is given by
# name, ``updated_at`` included (a Python-side onupdate default would not run here).

KEYS = cast(Table, ApiKey.__table__)
ENTRIES = cast(Table, LedgerEntry.__table__)
_K, _E = KEYS.c, ENTRIES.c
_FIGURES = (_K.budget_nusd, _K.spent_nusd, _K.reserved_nusd)
_x = bindparam("x", type_=BigInteger)
_now = bindparam("now", type_=UTCDateTime())

HOLD = (
    update(KEYS)
    .where(
        _K.id == bindparam("kid"),
        _K.status == "active",
        or_(_K.budget_nusd.is_(None), _K.budget_nusd - _K.spent_nusd - _K.reserved_nusd >= _x),
    )
    .values(reserved_nusd=_K.reserved_nusd + _x, updated_at=_now)
    .returning(*_FIGURES)
)
"""The reservation of ``x`` on key ``kid`` at ``now``: no row back = refused (inactive or short)."""

MOVE = (
    update(KEYS)
    .where(_K.id == bindparam("kid"))
    .values(
        reserved_nusd=_K.reserved_nusd - bindparam("held", type_=BigInteger),
        spent_nusd=_K.spent_nusd + bindparam("charged", type_=BigInteger),
        updated_at=_now,
    )
    .returning(*_FIGURES)
)
"""A settlement on key ``kid`` at ``now``: free ``held``, charge ``charged``."""

_RECORD_BINDS = {name: bindparam(name, type_=ENTRIES.c[name].type) for name in
                 ("id", "key_id", "run_id", "service", "operation", "model", "ref_id", "request_id",
                  "estimate_nusd", "created_at", "expires_at")}
_OPEN_ROW: dict[str, ColumnElement[Any]] = {
    "actual_nusd": null(), "overrun_nusd": literal_column("0"), "status": literal_column("'reserved'"),
    "settled_at": null()}
"""What a new row holds besides its binds: written into the SQL, not bound each time."""
RECORD = insert(ENTRIES).values({**_RECORD_BINDS, **_OPEN_ROW})
"""A new ledger row, open: the columns of :data:`_RECORD_BINDS` given by name (Ledger.reserve)."""
_STATE = select(_K.status, *_FIGURES).where(_K.id == bindparam("kid"))


def _chain_query() -> Select[Any]:
    walk = select(_K.id, _K.parent_id, literal(0).label("up")).where(_K.id == bindparam("kid")).cte(
        "chain", recursive=True
    )
    walk = walk.union_all(select(_K.id, _K.parent_id, walk.c.up + 1).join(walk, _K.id == walk.c.parent_id))
    return select(walk.c.id, walk.c.parent_id).order_by(walk.c.up.desc())


_CHAIN = _chain_query()


def chain_ids_of(work: Work, key_id: str) -> list[str]:
    """The ids of the key and its ancestors, root first, in one round trip."""
    rows = work.rows(_CHAIN, {"kid": key_id})
    if not rows or rows[0][1] is not None:  # missing, or an ancestor row is gone
        raise NotFound(f"key {key_id} not found")
    return [r[0] for r in rows]


def _close_statement(charge_estimate: bool, expired_only: bool) -> Update:
    stmt = update(ENTRIES).where(_E.id == bindparam("rid"), _E.status == "reserved")
    if expired_only:
        stmt = stmt.where(_E.expires_at < _now)
    charged: ColumnElement[int]
    overrun: ColumnElement[int]
    if charge_estimate:
        charged, overrun = _E.estimate_nusd, literal(0, BigInteger)
    else:
        charge = bindparam("charge", type_=BigInteger)
        over = _E.estimate_nusd < charge
        # Never above the reservation: the hold is the most a call can cost; the rest is recorded.
        charged = case((over, _E.estimate_nusd), else_=charge)
        overrun = case((over, charge - _E.estimate_nusd), else_=0)
    return stmt.values(
        status=bindparam("closing", type_=String), settled_at=_now, actual_nusd=charged, overrun_nusd=overrun
    ).returning(_E.key_id, _E.run_id, _E.estimate_nusd, _E.actual_nusd, _E.overrun_nusd, _E.service, _E.operation)


CLOSE = {(all_, expired): _close_statement(all_, expired) for all_ in (False, True) for expired in (False, True)}
"""Close an open reservation ``rid`` as ``closing`` at ``now``, by (charge the whole
estimate, only if expired before ``now``); ``charge`` is the real cost when not the estimate."""


# -- PostgreSQL: one statement per operation ---------------------------------------------------
# On PostgreSQL every statement is a round trip to the server (~120-220 µs here), most of a
# reservation's cost; data-modifying CTEs do a hold and its ledger row, or a close and its key's
# move, in one. Same statements inside, same row locks, same atomicity: the row is inserted only
# from the hold's RETURNING row, the key moved only from the close's. SQLite has no
# data-modifying CTEs and no round trip to save: it keeps the two-statement forms.

def _hold_and_record() -> Select[Any]:
    held = HOLD.cte("held")
    columns: dict[str, ColumnElement[Any]] = {**_RECORD_BINDS, **_OPEN_ROW}
    recorded = insert(ENTRIES).from_select(list(columns), select(*columns.values()).select_from(held)).cte("recorded")
    return select(held.c.budget_nusd, held.c.spent_nusd, held.c.reserved_nusd).add_cte(recorded)


HOLD_AND_RECORD = _hold_and_record()
"""PostgreSQL: :data:`HOLD` of ``x`` on key ``kid`` and, only if it held, the ledger row
(binds as :data:`RECORD`'s, ``estimate_nusd`` = ``x``); the key's figures, no row = refused."""


def _close_and_move(charge_estimate: bool, expired_only: bool) -> Select[Any]:
    closed = _close_statement(charge_estimate, expired_only).cte("closed")
    moved = (
        update(KEYS)
        .where(_K.id == closed.c.key_id, closed.c.key_id == closed.c.run_id)
        .values(reserved_nusd=_K.reserved_nusd - closed.c.estimate_nusd,
                spent_nusd=_K.spent_nusd + closed.c.actual_nusd, updated_at=_now)
        .returning(*_FIGURES)
        .cte("moved")
    )
    return select(*closed.c, moved.c.budget_nusd, moved.c.spent_nusd, moved.c.reserved_nusd).select_from(
        closed.outerjoin(moved, true())
    )


CLOSE_AND_MOVE = {flags: _close_and_move(*flags) for flags in CLOSE}
"""PostgreSQL: :data:`CLOSE` and, when the reservation's key is its run's root (a chain of one),
:data:`MOVE` on that key in the same statement: the close's seven columns, then the key's figures
(NULL when the key is a child: its chain is moved statement by statement)."""


@functools.lru_cache(maxsize=64)
def _lease(seconds: float) -> timedelta:
    """A reservation's time to live, made once per length (a ``timedelta`` costs ~1 µs, and every
    metered call asks for the same one)."""
    return timedelta(seconds=seconds)


REFUSALS: tuple[type[BaseException], ...] = (NotFound, KeyRevoked, KeyPaused, BudgetExhausted)
"""What a reservation raises by design, having written nothing (see Store.batched)."""


class Ledger:
    """Used by the gateway and by long-running workers alike."""

    def __init__(self, store: Store, config: LedgerConfig | None = None):
        self.store = store
        self.config = config or LedgerConfig()

    # -- reservations --------------------------------------------------------------------

    def reserve(
        self,
        key_id: str,
        *,
        service: str,
        operation: str,
        estimate_nusd: int,
        ref_id: str | None = None,
        request_id: str | None = None,
        ttl_s: float | None = None,
        chain_ids: tuple[str, ...] | list[str] | None = None,
        model: str | None = None,
    ) -> Reservation:
        """Hold ``estimate_nusd`` on the key and every ancestor, or raise BudgetExhausted.

        ``chain_ids`` (root first) may be passed by a caller that has just authenticated the
        key; parent links never change, so it saves reading the chain again. ``model``: the
        model the work names, kept on the row for spend by model (billing/spend.py).
        """
        hold = self._hold(key_id, service=service, operation=operation, estimate_nusd=estimate_nusd, ref_id=ref_id,
                          request_id=request_id, ttl_s=ttl_s, chain_ids=chain_ids, model=model)
        return self.store.batched(hold, clean=REFUSALS)

    async def reserve_async(
        self,
        key_id: str,
        *,
        service: str,
        operation: str,
        estimate_nusd: int,
        request_id: str | None = None,
        chain_ids: tuple[str, ...] | list[str] | None = None,
        model: str | None = None,
    ) -> Reservation:
        """:meth:`reserve` from an event loop, with no worker thread of its own (the gateway's
        path: :meth:`GroupCommit.run_async`). A caller cancelled once its hold was taken leaves
        nothing held: the hold is released."""
        hold = self._hold(key_id, service=service, operation=operation, estimate_nusd=estimate_nusd, ref_id=None,
                          request_id=request_id, ttl_s=None, chain_ids=chain_ids, model=model)
        return await self.store.batched_async(hold, clean=REFUSALS, orphaned=lambda r: self.release(r.id))

    def _hold(
        self,
        key_id: str,
        *,
        service: str,
        operation: str,
        estimate_nusd: int,
        ref_id: str | None,
        request_id: str | None,
        ttl_s: float | None,
        chain_ids: tuple[str, ...] | list[str] | None,
        model: str | None = None,
    ) -> Callable[[Work], Reservation]:
        """The unit of work that takes a reservation (for :meth:`Store.batched`)."""
        if estimate_nusd < 0:
            raise ValueError("estimate must be >= 0")
        ttl = _lease(ttl_s if ttl_s is not None else self.config.reservation_ttl_s)

        def entry(run_id: str) -> dict[str, Any]:
            now = utcnow()
            return {"id": new_ordered_id("res"), "key_id": key_id, "run_id": run_id, "service": service,
                    "operation": operation, "model": model, "ref_id": ref_id, "request_id": request_id,
                    "estimate_nusd": estimate_nusd, "created_at": now, "expires_at": now + ttl}

        def send_hold_and_record(work: Work, run_id: str) -> Callable[[], Reservation]:
            """PostgreSQL, a chain of one key: the hold and its row in one statement (sent
            without waiting for the previous unit's answer in a batch: :class:`Pipelined`)."""
            row = entry(run_id)
            sent = work.send(HOLD_AND_RECORD, {**row, "kid": key_id, "x": estimate_nusd, "now": row["created_at"]})

            def finish() -> Reservation:
                held = sent.first()
                if held is None:
                    self._refuse(work, key_id, estimate_nusd)
                figures: list[Figures] = [held]  # type: ignore[list-item]
                return Reservation(row["id"], key_id, run_id, estimate_nusd, service, operation, balance_from(figures))

            return finish

        if self.store.dialect == "postgresql" and chain_ids is not None and len(chain_ids) == 1:
            return Pipelined(lambda work: send_hold_and_record(work, chain_ids[0]))

        def hold(work: Work) -> Reservation:
            ids = list(chain_ids) if chain_ids else chain_ids_of(work, key_id)
            if work.dialect == "postgresql" and len(ids) == 1:
                return send_hold_and_record(work, ids[0])()
            row = entry(ids[0])
            now = row["created_at"]
            figures: list[Figures] = []
            for i, kid in enumerate(ids):  # root first: one lock order for every caller
                held = work.first(HOLD, {"kid": kid, "x": estimate_nusd, "now": now})
                if held is None:
                    # Give back the holds already taken on the ancestors: a refusal leaves no
                    # write behind, so the group commit can go on with the rest of its batch.
                    for taken in ids[:i]:
                        work.one(MOVE, {"kid": taken, "held": estimate_nusd, "charged": 0, "now": now})
                    self._refuse(work, kid, estimate_nusd)
                figures.append(held)  # type: ignore[arg-type]
            work.rows(RECORD, row)
            return Reservation(row["id"], key_id, ids[0], estimate_nusd, service, operation, balance_from(figures))

        return hold

    @staticmethod
    def _refuse(work: Work, key_id: str, estimate_nusd: int) -> None:
        key = work.first(_STATE, {"kid": key_id})
        if key is None:
            raise NotFound(f"key {key_id} not found")
        status, budget, spent, reserved = key
        if status == "revoked":
            raise KeyRevoked("this key has been revoked")
        if status == "paused":
            raise KeyPaused("this key is paused")
        remaining = (budget or 0) - spent - reserved
        raise BudgetExhausted(
            f"budget exhausted: this call may cost up to {format_usd(estimate_nusd)} USD "
            f"and {format_usd(max(remaining, 0))} USD remain",
            headers={"Retry-After": "30"} if reserved else {},
        )

    def settle(self, reservation_id: str, actual_nusd: int) -> int:
        """Charge the real cost (clamped to the reservation; any excess is recorded as the
        row's overrun) and free the hold.

        Returns what was charged; 0 if the reservation was already closed (a second settle,
        or the reaper got there first) — nothing is ever charged twice.
        """
        closed = self._close(reservation_id, "settled", actual_nusd)
        return 0 if closed is None else closed[0]

    def settle_with_balance(self, reservation_id: str, actual_nusd: int) -> tuple[int, Balance | None]:
        """:meth:`settle`, also returning the key's balance after it (None if already closed)."""
        closed = self._close(reservation_id, "settled", actual_nusd)
        return (0, None) if closed is None else closed

    async def settle_with_balance_async(self, reservation_id: str, actual_nusd: int) -> tuple[int, Balance | None]:
        """:meth:`settle_with_balance` from an event loop (see :meth:`reserve_async`)."""
        close = self._closing(reservation_id, "settled", actual_nusd)
        closed = self._closed(await self.store.batched_async(close), reservation_id)
        return (0, None) if closed is None else closed

    def release(self, reservation_id: str) -> None:
        """Give the hold back: the work did not happen."""
        self._close(reservation_id, "released", 0)

    async def release_async(self, reservation_id: str) -> None:
        """:meth:`release` from an event loop (see :meth:`reserve_async`)."""
        await self.store.batched_async(self._closing(reservation_id, "released", 0))

    def _close(
        self, reservation_id: str, status: str, actual_nusd: int | None, *, expired_only: bool = False
    ) -> tuple[int, Balance] | None:
        """Close an open reservation: (charged, balance after); None when it was not open.

        ``actual_nusd`` None charges the whole estimate (an expired hold: the work may have
        happened), which is not an overrun.
        """
        close = self._closing(reservation_id, status, actual_nusd, expired_only=expired_only)
        return self._closed(self.store.batched(close), reservation_id)

    @staticmethod
    def _closing(
        reservation_id: str, status: str, actual_nusd: int | None, *, expired_only: bool = False
    ) -> Callable[[Work], Closed | None]:
        """The unit of work that closes a reservation (for :meth:`Store.batched`)."""
        params: dict[str, Any] = {"rid": reservation_id, "closing": status, "now": utcnow()}
        if actual_nusd is not None:
            params["charge"] = max(0, actual_nusd)

        def send_close(work: Work) -> Callable[[], Closed | None]:
            one_statement = work.dialect == "postgresql"
            sent = work.send((CLOSE_AND_MOVE if one_statement else CLOSE)[actual_nusd is None, expired_only], params)

            def finish() -> Closed | None:
                found = sent.first()
                if found is None:
                    return None
                closed, moved = found[:7], found[7:]
                if one_statement and moved[1] is not None:  # spent is never NULL: the key was moved
                    return closed, [moved]
                key_id, run_id, estimate, charged = closed[:4]
                ids = [key_id] if key_id == run_id else chain_ids_of(work, key_id)
                move = {"held": estimate, "charged": charged, "now": params["now"]}
                return closed, [work.one(MOVE, {**move, "kid": kid}) for kid in ids]

            return finish

        return Pipelined(send_close)

    @staticmethod
    def _closed(done: Closed | None, reservation_id: str) -> tuple[int, Balance] | None:
        """What a close produced: (charged, balance after), the overrun logged; None when it was not open."""
        if done is None:
            return None
        (_key_id, run_id, estimate, charged, overrun, service, operation), figures = done
        if overrun:
            log.warning(
                "overrun: %s %s of run %s (%s) cost %s USD over its reservation of %s USD; "
                "the run was charged the reservation", service, operation, run_id, reservation_id,
                format_usd(overrun), format_usd(estimate),
            )
        assert charged is not None  # actual_nusd was set, to a non-NULL expression, just above
        return charged, balance_from(figures)

    def extend(self, reservation_id: str, ttl_s: float | None = None) -> bool:
        """A live holder renews its lease so the reaper leaves it alone."""
        ttl = timedelta(seconds=ttl_s if ttl_s is not None else self.config.reservation_ttl_s)
        with self.store.transaction() as s:
            res = s.execute(
                update(LedgerEntry)
                .where(LedgerEntry.id == reservation_id, LedgerEntry.status == "reserved")
                .values(expires_at=utcnow() + ttl)
                .execution_options(synchronize_session=False)
            )
            # SQLAlchemy 2.1 types Session.execute() as Result; an UPDATE returns a CursorResult.
            return cast(CursorResult[Any], res).rowcount == 1

    def reclaim_expired(self, limit: int = 500) -> int:
        """Close reservations whose holder crashed (expired leases). Returns how many."""
        with self.store.transaction() as s:
            ids = s.scalars(
                select(LedgerEntry.id)
                .where(OPEN_ROW, LedgerEntry.expires_at < utcnow())
                .limit(limit)
            ).all()
        # "charge" bills the whole estimate (None: see _close).
        actual = None if self.config.expired_reservations == "charge" else 0
        closed = (self._close(rid, "expired", actual, expired_only=True) for rid in ids)
        return sum(1 for charged in closed if charged is not None)

    # -- reading -------------------------------------------------------------------------

    def balance(self, key_id: str) -> Balance:
        with self.store.transaction() as s:
            return balance_of(chain_of(s, key_id))

    def entries(self, run_or_key_id: str, *, include_children: bool = True, limit: int = 10_000) -> list[dict[str, Any]]:
        with self.store.transaction() as s:
            key = s.get(ApiKey, run_or_key_id)
            if key is None:
                raise NotFound(f"key {run_or_key_id} not found")
            where: ColumnElement[bool]
            if include_children:
                ids = _subtree(s, key.id)
                where = LedgerEntry.key_id.in_(ids)
            else:
                where = LedgerEntry.key_id == key.id
            # Every key of the subtree is of the key's run: the (run, key) index finds them.
            where = and_(LedgerEntry.run_id == key.root_id, where)
            rows = s.scalars(select(LedgerEntry).where(where).order_by(LedgerEntry.created_at).limit(limit)).all()
            return [ledger_row(r) for r in rows]


def _subtree(s: Session, key_id: str) -> list[str]:
    ids, frontier = [key_id], [key_id]
    while frontier:
        frontier = list(s.scalars(select(ApiKey.id).where(ApiKey.parent_id.in_(frontier))).all())
        ids.extend(frontier)
    return ids


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def ledger_row(r: LedgerEntry) -> dict[str, Any]:
    return {
        "id": r.id,
        "key_id": r.key_id,
        "run_id": r.run_id,
        "service": r.service,
        "operation": r.operation,
        "model": r.model,
        "ref_id": r.ref_id,
        "request_id": r.request_id,
        "status": r.status,
        "estimate_usd": nusd_to_usd(r.estimate_nusd),
        "actual_usd": None if r.actual_nusd is None else nusd_to_usd(r.actual_nusd),
        "overrun_usd": nusd_to_usd(r.overrun_nusd or 0),
        "created_at": _iso(r.created_at),
        "expires_at": _iso(r.expires_at),
        "settled_at": _iso(r.settled_at),
    }


@dataclass
class StepMeter:
    """Per-step metering for long jobs (training, evaluation, sandboxes).

    Each step reserves its own worst case before it runs; when a step cannot be paid for,
    :meth:`step` raises :class:`BudgetExhausted` *before* the work, so the job stops
    fail-closed and nothing is charged for a step that did not happen::

        meter = StepMeter(ledger, key_id, "training", "train_step", ref_id=job_id)
        with meter.step(estimate) as step:
            loss = train_one_step()
            step.actual_nusd = measured_cost
    """

    ledger: Ledger
    key_id: str
    service: str
    operation: str
    ref_id: str | None = None
    charged_nusd: int = 0
    steps: int = 0
    model: str | None = None
    """The model the job works on (a training job's base model), kept on each step's row."""

    @contextlib.contextmanager
    def step(self, estimate_nusd: int) -> Iterator[_Step]:
        res = self.ledger.reserve(self.key_id, service=self.service, operation=self.operation, estimate_nusd=estimate_nusd,
                                  ref_id=self.ref_id, model=self.model)
        step = _Step(actual_nusd=estimate_nusd)
        try:
            yield step
        except BaseException:
            if step.performed:
                self.charged_nusd += self.ledger.settle(res.id, step.actual_nusd)
            else:
                self.ledger.release(res.id)
            raise
        self.charged_nusd += self.ledger.settle(res.id, step.actual_nusd)
        self.steps += 1


@dataclass
class _Step:
    actual_nusd: int
    performed: bool = False
    """Set to True once irreversible work has happened, so a failure after it is still billed."""
