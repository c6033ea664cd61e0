"""``UTCDateTime`` on SQLite formats its text in one call (storage/tables.py). SQLite compares
timestamps as text (a reservation's expiry, say), so the text must be exactly what SQLAlchemy's
SQLite ``DATETIME`` wrote before, for every value, and a naive datetime is still refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any, cast

import pytest
from sqlalchemy import TypeDecorator
from sqlalchemy.dialects import sqlite

from storage.tables import UTCDateTime

VALUES = [
    datetime(2026, 12, 3, 15, 0, 0, tzinfo=UTC),  # no microseconds: still six digits
    datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    datetime(999, 5, 6, 7, 8, 9, tzinfo=UTC),  # a three-digit year: zero-padded
    datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(2026, 12, 3, 15, 0, 0, 5, tzinfo=timezone(timedelta(hours=5))),  # another zone: converted
    datetime(2026, 12, 3, 1, 0, 0, tzinfo=timezone(timedelta(hours=-3, minutes=-30))),
    datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(0))),  # UTC, but not the UTC object
    None,
]


@pytest.mark.parametrize("value", VALUES)
def test_the_sqlite_text_is_sqlalchemys(value: datetime | None) -> None:
    dialect = sqlite.dialect()
    impl = cast(UTCDateTime, UTCDateTime().dialect_impl(dialect))
    # TypeDecorator's own: process_bind_param, then SQLite DATETIME's text (what was used before)
    composed: Any = TypeDecorator.bind_processor(impl, dialect)
    fused = impl.bind_processor(dialect)
    assert composed is not None and fused is not None
    assert fused(value) == composed(value)


def test_a_naive_datetime_is_refused() -> None:
    dialect = sqlite.dialect()
    fused = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    assert fused is not None
    with pytest.raises(ValueError, match="naive"):
        fused(datetime(2026, 12, 3, 15, 0, 0))


def test_text_order_is_time_order() -> None:
    dialect = sqlite.dialect()
    fused = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    assert fused is not None
    times = sorted(v for v in VALUES if v is not None)
    assert [fused(t) for t in times] == sorted(fused(t) for t in times)
