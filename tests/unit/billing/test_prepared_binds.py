"""A prepared statement's driver parameters (storage/store.py ``Prepared.parameters``),
built from a plan made once, against the plain rule they must equal: the statement's constants
overlaid by the given values, each value through its type's bind processor, in the order the
driver takes them — for every statement the ledger runs, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import ClauseElement
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from billing import ledger
from storage.store import Prepared

NOW = datetime(2026, 12, 5, 7, 1, 2, 345678, tzinfo=UTC)
ELSEWHERE = datetime(2026, 12, 5, 9, 1, 2, 7, tzinfo=timezone(timedelta(hours=2)))
VALUES: dict[str, Any] = {
    "kid": "key_a", "x": 1_000, "now": NOW, "held": 1_000, "charged": 700, "charge": 700, "rid": "res_a",
    "closing": "settled", "id": "res_a", "key_id": "key_a", "run_id": "key_a", "service": "rollout",
    "operation": "chat.completions", "model": "teacher", "ref_id": None, "request_id": "req_a", "estimate_nusd": 1_000,
    "created_at": NOW, "expires_at": ELSEWHERE, "actual_nusd": None, "overrun_nusd": 0, "status": "reserved",
    "settled_at": None, "unused": "extra",
}
STATEMENTS = {
    "hold": ledger.HOLD, "move": ledger.MOVE, "record": ledger.RECORD,  # the statements the ledger runs
    **{f"close {flags}": stmt for flags, stmt in ledger.CLOSE.items()},
    "hold and record": ledger.HOLD_AND_RECORD,
    **{f"close and move {flags}": stmt for flags, stmt in ledger.CLOSE_AND_MOVE.items()},
}


def plain_rule(stmt: ClauseElement, dialect: Dialect, given: dict[str, Any]) -> dict[str, Any] | tuple[Any, ...]:
    compiled: Any = stmt.compile(dialect=dialect)
    values = {name: bind.effective_value for bind, name in compiled.bind_names.items() if not bind.required}
    values.update(given)
    for bind, name in compiled.bind_names.items():
        processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None and name in values:
            values[name] = processor(values[name])
    if compiled.positional:
        return tuple(values[name] for name in compiled.positiontup)
    return {name: values[name] for name in dict.fromkeys(compiled.bind_names.values())}


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.dialect(paramstyle="pyformat")],
                         ids=["sqlite", "postgresql"])
@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_the_plan_gives_what_the_plain_rule_gives(name: str, dialect: Dialect) -> None:
    stmt = STATEMENTS[name]
    compiled: Any = stmt.compile(dialect=dialect)
    given = {k: v for k, v in VALUES.items() if k in set(compiled.bind_names.values()) or k == "unused"}
    got = Prepared(stmt, dialect).parameters(given)
    want = plain_rule(stmt, dialect, given)
    if isinstance(got, dict):  # named: the statement's binds (a driver ignores any other key)
        got = {k: got[k] for k in want}
    assert got == want
    if dialect.name == "sqlite":  # SQLite keeps UTC wall time as text; an aware value of another zone is converted
        texts = [v for v in (got.values() if isinstance(got, dict) else got) if isinstance(v, str) and v[:4] == "2026"]
        assert set(texts) <= {"2026-12-05 07:01:02.345678", "2026-12-05 07:01:02.000007"}  # 09:01+02:00 is 07:01 UTC
