"""What the services' read modules share: a row's view dataclass, a job's fraction done, a run's
rows by creation time, and the keyset paging of a table's rows as operators list them across runs
(ops/admin_lists.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from storage.store import Store

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def progress(done: int, total: int) -> float | None:
    """A job's fraction done; None when its size is unknown."""
    return None if total <= 0 else min(1.0, done / total)


def view[V: DataclassInstance](cls: type[V], row: Any) -> V:
    """The view dataclass ``cls`` of a row: its fields, read by name (the read modules' shared helper)."""
    return cls(**{f.name: getattr(row, f.name) for f in fields(cls)})


def by_creation(s: Session, table: Any, *, run_id: str | None = None, newest_first: bool = False,
                limit: int | None = None, in_flight: bool | None = None,
                open_statuses: tuple[str, ...] = ()) -> list[Any]:
    """``table``'s rows by ``created_at``, of one run or all, in ``s``; ``in_flight``: only those
    whose ``status`` is one of ``open_statuses`` (True) or none of them (False)."""
    query = select(table)
    if run_id is not None:
        query = query.where(table.run_id == run_id)
    if in_flight is not None:
        query = query.where(table.status.in_(open_statuses) if in_flight else table.status.not_in(open_statuses))
    order = table.created_at.desc() if newest_first else table.created_at
    return list(s.scalars(query.order_by(order).limit(limit)))


@dataclass(frozen=True)
class ListQuery:
    """A page of a list across runs: its filters (None: any), the (time, id) of the row it starts
    after (None: from the newest) and how many rows to read."""

    run_id: str | None
    key_id: str | None
    status: str | None
    after: tuple[datetime, str] | None
    rows: int


@dataclass(frozen=True)
class Listing:
    """One kind of row as operators list it across runs (ops/admin_lists.py): its columns, the time
    column it is ordered by (newest first, ties by id) and paged on, whether it has a key and a
    status to filter by, and ``read``, which returns a page as {column: value} rows. The table
    stays inside its service's read module."""

    columns: tuple[str, ...]
    time: str
    keyed: bool
    statused: bool
    read: Callable[[Store, ListQuery], list[dict[str, Any]]]


def listing(table: Any, time: InstrumentedAttribute[Any], columns: tuple[str, ...],
            status: InstrumentedAttribute[Any] | None = None) -> Listing:
    """The :class:`Listing` of one of a service's tables (the keyset paging the read modules share)."""

    def read(store: Store, q: ListQuery) -> list[dict[str, Any]]:
        query = select(table)
        if q.run_id is not None:
            query = query.where(table.run_id == q.run_id)
        if q.key_id is not None:
            query = query.where(table.key_id == q.key_id)
        if q.status is not None and status is not None:
            query = query.where(status == q.status)
        if q.after is not None:
            when, row_id = q.after
            query = query.where(or_(time < when, and_(time == when, table.id < row_id)))
        query = query.order_by(time.desc(), table.id.desc()).limit(q.rows)
        with store.transaction() as s:
            return [{name: getattr(row, name) for name in columns} for row in s.scalars(query)]

    return Listing(columns, time.key, hasattr(table, "key_id"), status is not None, read)
