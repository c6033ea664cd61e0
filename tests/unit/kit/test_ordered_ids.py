"""Time-ordered ids (kit/ids.py): what the ledger's index locality relies on, and
what keeps them unguessable."""

from __future__ import annotations

import re

import pytest

from kit import ids
from storage.tables import LedgerEntry


def test_ids_sort_by_the_millisecond_they_were_made(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    for ms in (1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_999, 1_800_000_000_000, 1_800_000_000_001):
        monkeypatch.setattr(ids.time, "time_ns", lambda ms=ms: ms * 1_000_000 + 999_999)
        made.extend(ids.new_ordered_id("res") for _ in range(50))
    # Within a millisecond the random bits decide; across milliseconds, the time does.
    by_ms = [made[i:i + 50] for i in range(0, len(made), 50)]
    for earlier, later in zip(by_ms, by_ms[1:], strict=False):
        assert max(earlier) < min(later)


def test_ids_made_in_one_millisecond_are_distinct_and_unguessable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_765_000_000_000 * 1_000_000)
    made = [ids.new_ordered_id("res") for _ in range(20_000)]
    assert len(set(made)) == len(made)
    shape = re.compile(r"res_([0-9a-f]{12})([0-9a-f]{20})")
    parts = [shape.fullmatch(i) for i in made]
    assert all(parts), "prefix, 12 hex digits of ms, 20 hex digits (80 bits) of randomness"
    assert {p.group(1) for p in parts if p} == {f"{1_765_000_000_000:012x}"}
    assert len({p.group(2) for p in parts if p}) == len(made)


def test_a_ledger_id_fits_its_column() -> None:
    length = LedgerEntry.__table__.c.id.type.length  # type: ignore[attr-defined]
    assert len(ids.new_ordered_id("res")) <= length
