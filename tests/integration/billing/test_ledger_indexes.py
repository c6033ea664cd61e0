"""The ledger's indexes are shaped so a reservation writes few entries (docs/performance.md,
"Ledger throughput"); every read of the ledger must still find its rows by an index, on both
stores, and with the plan PostgreSQL would cache for a prepared statement. A read whose terms
stop matching an index (a partial index's ``status = 'reserved'`` bound as a parameter, a key's
rows asked for without their run) turns into a scan of the whole ledger: these tests see it."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

import psycopg
from sqlalchemy import event, update

from access.keys import KeyRegistry
from access.presets import preset_policy
from billing.ledger import Ledger
from jobs.lifecycle import JobRunnerBase
from kit.config import GymConfig
from ops.dashboard.queries import run_detail
from ops.timeline import run_timeline
from storage.store import Store
from storage.tables import LedgerEntry, utcnow


@contextmanager
def ledger_reads(store: Store) -> Iterator[list[tuple[str, Any]]]:
    """Every SELECT on the ledger the store runs inside, as (SQL, parameters)."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM ledger" in statement:
            seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def plan(store: Store, statement: str, parameters: Any) -> str:
    """The store's plan for the statement, as text. PostgreSQL: the generic plan (what a prepared
    statement ends with: parameters unknown when planned), sequential scans priced out so that
    an empty table's plan still shows whether an index could serve."""
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur = raw.cursor()
        if store.dialect == "sqlite":
            cur.execute("EXPLAIN QUERY PLAN " + statement, parameters)
            return "\n".join(str(row[3]) for row in cur.fetchall())
        # PREPARE with $n for psycopg's %(name)s, then EXPLAIN EXECUTE the values given.
        names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
        prepared = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement)
        cur.execute("SET enable_seqscan = off")
        cur.execute("SET plan_cache_mode = force_generic_plan")
        cur.execute("PREPARE rsigym_plan AS " + prepared.replace("%%", "%"))
        client = psycopg.ClientCursor(cast(psycopg.Connection[Any], raw))
        client.execute(f"EXPLAIN EXECUTE rsigym_plan({', '.join(['%s'] * len(names))})",
                       [parameters[name] for name in names])
        found = "\n".join(str(row[0]) for row in client.fetchall())
        raw.rollback()
        cur.execute("DEALLOCATE rsigym_plan")
        return found


def scans_the_ledger(store: Store, text: str) -> bool:
    if store.dialect == "sqlite":
        return any(line.startswith("SCAN ledger") for line in text.splitlines())
    return "Seq Scan on ledger" in text


def test_every_read_of_the_ledger_is_served_by_an_index(store: Store) -> None:
    policy = preset_policy("joint", GymConfig())
    registry, ledger = KeyRegistry(store), Ledger(store)
    run, _ = registry.create(policy=policy, budget_nusd=10**9)
    child, _ = registry.create(policy=policy, budget_nusd=None, parent_id=run["id"])
    ledger.reserve(child["id"], service="training", operation="train_step", estimate_nusd=5, ref_id="job_1")
    expired = ledger.reserve(run["id"], service="rollout", operation="chat", estimate_nusd=7)
    ledger.settle(ledger.reserve(run["id"], service="rollout", operation="chat", estimate_nusd=3).id, 2)
    with store.transaction() as s:
        s.execute(update(LedgerEntry).where(LedgerEntry.id == expired.id)
                  .values(expires_at=utcnow() - timedelta(seconds=1)))

    reads: dict[str, Callable[[], Any]] = {
        "the reaper's open holds": lambda: ledger.reclaim_expired(),
        "a dead job's holds": lambda: JobRunnerBase.release_holds(
            SimpleNamespace(store=store, ledger=ledger), "job_1"),  # type: ignore[arg-type]
        "a run's bill": lambda: ledger.entries(run["id"]),
        "a key's bill": lambda: ledger.entries(child["id"], include_children=False),
        "the run's timeline": lambda: run_timeline(store, run["id"]),
        "the dashboard's run page": lambda: run_detail(store, run["id"], 50),
    }
    for name, read in reads.items():
        with ledger_reads(store) as seen:
            read()
        assert seen, f"{name}: no read of the ledger seen"
        for statement, parameters in seen:
            text = plan(store, statement, parameters)
            assert not scans_the_ledger(store, text), f"{name} scans the whole ledger:\n{statement}\n{text}"

    # And the reads found what they were asked for.
    assert ledger.entries(run["id"]) and len(ledger.entries(child["id"], include_children=False)) == 1
    with store.transaction() as s:
        statuses = {r.id: r.status for r in s.query(LedgerEntry)}
    assert statuses[expired.id] == "expired" and list(statuses.values()).count("released") == 1
