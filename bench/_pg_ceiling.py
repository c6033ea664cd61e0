"""What the PostgreSQL server alone sustains on the ledger's own statements: the ceilings that
bench/ledger_throughput.py compares the ledger with.

``pgbench`` (C, one connection, prepared statements) runs the two statements a pair costs on
PostgreSQL: ``HOLD_AND_RECORD`` then ``CLOSE_AND_MOVE`` (billing/ledger.py), compiled from
the ledger's own SQLAlchemy statements, with the binds the gateway gives (a run key, the bench's
amounts, the server's clock). No Python is on the path, so the gap to it is the Python side's
(driver, group commit, event loop), at the same server, schema and disk. Two forms:

* :func:`server_ceiling`: ``BATCH`` pairs a transaction in pipeline mode, every hold before every
  close, as a group commit sends them: the reference for the ledger under load;
* :func:`one_caller_ceiling`: one pair as one caller commits it, the hold in a transaction of its
  own, then the close in another, each answered before the next is sent: what a client with no
  work of its own gets at one caller, two durable commits a pair (``synchronous_commit`` as the
  gym leaves it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import Any

from sqlalchemy import ClauseElement, make_url

from billing.ledger import CLOSE_AND_MOVE, HOLD_AND_RECORD
from storage.store import Prepared, Store

BATCH = 32
"""Pairs a transaction: about what a group commit gathers at 64 callers."""


class _Sql(str):
    """An SQL expression written as it is (not quoted as a value)."""


_NOW = _Sql("(now() AT TIME ZONE 'utc')")


def _literal(value: Any) -> str:
    if isinstance(value, _Sql):
        return str(value)
    if value is None:
        return "NULL"
    if isinstance(value, bool | int):
        return str(int(value))
    return "'" + str(value).replace("'", "''") + "'"


def _render(prepared: Prepared, values: dict[str, Any]) -> str:
    """The statement with each ``%(name)s`` written as its value (the constants' included)."""
    given = {**prepared.constants, **values}
    return re.sub(r"%\((\w+)\)s", lambda m: _literal(given[m.group(1)]), prepared.sql)


def _pair(store: Store, key_id: str, estimate: int, actual: int, i: int) -> tuple[str, str]:
    """Pair ``i`` of a script: the hold and its row, then the close and the move, each one line."""
    def prepared(stmt: ClauseElement) -> Prepared:
        return Prepared(stmt, store.engine.dialect)

    rid = _Sql(f"('res_pgbench' || :r{i})")
    hold = _render(prepared(HOLD_AND_RECORD), {
        "kid": key_id, "x": estimate, "now": _NOW, "id": rid, "key_id": key_id, "run_id": key_id,
        "service": "rollout", "operation": "chat.completions", "model": "teacher", "ref_id": None, "request_id": "req_bench",
        "estimate_nusd": estimate, "created_at": _NOW,
        "expires_at": _Sql("((now() + interval '5 minutes') AT TIME ZONE 'utc')")})
    close = _render(prepared(CLOSE_AND_MOVE[(False, False)]), {"rid": rid, "charge": actual, "closing": "settled",
                                                               "now": _NOW})
    return hold.replace("\n", " ") + ";", close.replace("\n", " ") + ";"


def pgbench_script(store: Store, key_id: str, estimate: int, actual: int, batch: int = BATCH) -> str:
    """``batch`` pairs a transaction, pipelined: every hold, then every close, one ``COMMIT``."""
    pairs = [_pair(store, key_id, estimate, actual, i) for i in range(batch)]
    lines = [f"\\set r{i} random(1, 9000000000000000000)" for i in range(batch)]
    lines += ["\\startpipeline", "BEGIN;", *(hold for hold, _ in pairs), *(close for _, close in pairs),
              "COMMIT;", "\\endpipeline"]
    return "\n".join(lines) + "\n"


def one_caller_script(store: Store, key_id: str, estimate: int, actual: int) -> str:
    """One pair as one caller's reservation and settlement commit it: the hold in a transaction
    of its own, then the close in another, each waiting for its answer (no pipeline: one caller
    has nothing to send ahead). Each commit waits for the server's WAL flush
    (``synchronous_commit``, as the gym's store leaves it)."""
    hold, close = _pair(store, key_id, estimate, actual, 0)
    return "\n".join(["\\set r0 random(1, 9000000000000000000)", hold, close]) + "\n"


def _pgbench_tps(store: Store, pg_url: str, script_text: str, seconds: float) -> float | None:
    """pgbench's scripts/s on ``store``'s schema (one connection, prepared statements); None
    where pgbench is not installed or did not run."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        return None
    url = make_url(pg_url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="rsigym-pgbench-") as script:
        script.write(script_text)
        script.flush()
        env = {**os.environ, "PGOPTIONS": f"-csearch_path={store.schema}"}
        if url.password:
            env["PGPASSWORD"] = url.password
        done = subprocess.run(
            [pgbench, "-n", "-M", "prepared", "-c", "1", "-T", str(max(1, round(seconds))), "-f", script.name,
             "-h", url.host or "127.0.0.1", "-p", str(url.port or 5432), "-U", url.username or "postgres",
             url.database or "postgres"],
            capture_output=True, text=True, env=env, timeout=seconds + 120, check=False)
    found = re.search(r"^tps = ([0-9.]+)", done.stdout, re.MULTILINE)
    return float(found.group(1)) if found and done.returncode == 0 else None


def server_ceiling(store: Store, pg_url: str, key_id: str, estimate: int, actual: int,
                   seconds: float) -> float | None:
    """Pairs/s pgbench sustains on key ``key_id`` of ``store``'s schema, ``BATCH`` pairs a
    transaction (left with every hold settled: ``actual`` charged per pair it completed); None
    where pgbench is not installed or did not run."""
    tps = _pgbench_tps(store, pg_url, pgbench_script(store, key_id, estimate, actual), seconds)
    return None if tps is None else tps * BATCH


def one_caller_ceiling(store: Store, pg_url: str, key_id: str, estimate: int, actual: int,
                       seconds: float) -> float | None:
    """Pairs/s pgbench makes on key ``key_id`` as one caller (:func:`one_caller_script`): what a
    client with no work of its own gets from this server at one caller when each reservation and
    each settlement is committed before the caller goes on (the commits' WAL flushes are most of
    it). None as :func:`server_ceiling`."""
    return _pgbench_tps(store, pg_url, one_caller_script(store, key_id, estimate, actual), seconds)
