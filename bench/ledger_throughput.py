"""Ledger throughput: reserve+settle pairs per second through the real ledger, against bare SQL.

For each store (SQLite file, PostgreSQL schema), each key pattern (``hot``: every caller on one
run key; ``spread``: callers cycle over ``--keys`` run keys) and each number of concurrent
callers (``--callers``, default 1, 64, 1000), runs for ``--seconds``:

* ``ledger``: ``Ledger.reserve`` then ``Ledger.settle_with_balance`` (billing/ledger.py),
  called as the gateway calls them (``chain_ids`` given, a request id, a ``LedgerEntry`` row per
  pair), on a :class:`Store` with its default pool (20 + 20 connections);
* ``solo``: the same ledger with group commit off (``[store] group_commit_max = 1``: every
  reservation and settlement its own transaction and commit), on a second :class:`Store` on the
  same database: the in-run before/after of storage/group_commit.py;
* ``hop`` and ``async``: the same ledger called by coroutines on one event loop (one task per
  caller; uvloop, the loop the gym's server runs on), as the gateway calls it:
  ``hop`` through a worker thread per call (``Store.call``, the
  gateway's earlier path), ``async`` by ``Ledger.reserve_async`` /
  ``settle_with_balance_async`` (``GroupCommit.run_async``: queued without a thread each, batches
  led by the store's writer thread; on SQLite a caller with no company runs its work on the loop
  itself) — the gateway's path now; keys of their own;
* ``raw``, the baseline in the same run on the same database: the bare conditional
  ``UPDATE api_keys SET reserved_nusd = reserved_nusd + x WHERE id = k AND status = 'active'
  AND budget_nusd - spent_nusd - reserved_nusd >= x`` then the settle ``UPDATE`` (reserved - x,
  spent + actual), each its own autocommitted transaction, through the driver (sqlite3 /
  psycopg) with no ORM, on as many connections as the store's pool holds (one per caller when
  fewer callers), with the store's SQLite pragmas. Raw pairs use their own keys.

Concurrency: one OS thread per caller (``threading.Thread``; the ledger is synchronous), all
released together by a barrier, each looping until the deadline; pairs/s = pairs completed /
wall time until the last caller returned (at 1,000 callers each caller finishes at least one
pair, so a slow store stretches the cell past ``--seconds``). Every caller's pairs are counted
per key. The store's pool wait is raised to 600 s: the gateway admits only as many threads as
the pool holds, so queueing 1,000 threads on 40 connections is the bench's doing, not a refusal.

Before the cells, the process's garbage collector is set as a gym server sets it before it
serves (:func:`kit.heap.prepare_heap`: the heap built so far frozen, young passes every
10,000 allocations): every cell runs in the conditions of the gateway's process.

At the end, per store, the 0-overspend check: every key's spent + reserved <= budget, reserved
== 0, spent == pairs counted x the settled amount; no ledger row left ``reserved``; per ledger
key the settled rows' count == its pairs and their sum == its spent. Prints OK or each finding.

The bounds a run is read against, measured in it: on each store, the *floor of one caller* (the
ledger's own statements and transactions on the bare driver, no gym code around them); on
PostgreSQL, the *server's ceiling* (pgbench's C client, the ledger's two statements, 32 pairs a
pipelined transaction: the reference for group commit) and *one caller's ceiling* (the same client
and statements, each in a transaction of its own, each committed durably before the next is sent:
what a client with no work of its own gets from this server at one caller). Under the goal's line the
bench prints the verdict for the gateway's path under load (the ``async`` cells with more than
one caller) and for one caller, with one caller's bound on this machine (PostgreSQL: the best of
the one-caller ceilings; SQLite: the floor) and whether the goal is within its reach.
``--profile`` adds a cProfile of the 1-caller SQLite ledger run (top entries by cumulative time).

``--ledger-rows N`` first puts N settled rows in the ledger, on 1,000 keys of their own, made as
the ledger makes its rows (ids included): the state of a gym that has metered N calls, whose
ledger indexes are as deep as that. The cells start from an empty ledger without it (and the
rows of the cells before accumulate: ~250,000 by the last SQLite cell).

    .venv/bin/python bench/ledger_throughput.py [--seconds 1.5] [--callers 1,64,1000] [--keys 1000]
        [--store sqlite,postgres] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--profile]
        [--ledger-rows 0]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import importlib.util
import io
import os
import pstats
import queue
import sqlite3
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from _common import fresh_pg_schema  # (importing _common puts the repository root on sys.path)
from _pg_ceiling import BATCH, one_caller_ceiling, server_ceiling
from sqlalchemy import bindparam, func, insert, make_url, select

from access.keys import KeyRegistry
from access.presets import preset_policy
from billing.ledger import CLOSE, CLOSE_AND_MOVE, ENTRIES, HOLD, HOLD_AND_RECORD, MOVE, RECORD, Ledger
from kit.config import GymConfig
from kit.errors import BudgetExhausted
from kit.heap import prepare_heap
from kit.ids import new_ordered_id
from kit.settings import StoreSettings
from storage.store import Store, sqlite_url
from storage.tables import ApiKey, LedgerEntry, utcnow

ESTIMATE = 1_000  # nano-USD held per call
ACTUAL = 700  # nano-USD charged at settlement
BUDGET = 10**15  # never the binding limit: the bench measures throughput, not refusals
LEASE = timedelta(seconds=600)  # a bench row's lease: none expires during a run

RAW_RESERVE = ("UPDATE api_keys SET reserved_nusd = reserved_nusd + {p} WHERE id = {p} AND status = 'active' "
               "AND (budget_nusd IS NULL OR budget_nusd - spent_nusd - reserved_nusd >= {p})")
RAW_SETTLE = "UPDATE api_keys SET reserved_nusd = reserved_nusd - {p}, spent_nusd = spent_nusd + {p} WHERE id = {p}"

SERVE_LOOP = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio's loop"
"""The loop the gym's server runs on: uvicorn's ``loop="auto"`` takes uvloop when it is installed
(it is, with ``uvicorn[standard]``), else asyncio's own."""

Pair = Callable[[str], None]
"""One reserve+settle on a key; raises on refusal or error."""
AsyncPair = Callable[[str], Awaitable[None]]


@dataclass
class Cell:
    store: str
    pattern: str
    callers: int
    kind: str
    pairs: int = 0
    seconds: float = 0.0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def rate(self) -> float:
        return self.pairs / self.seconds if self.seconds else 0.0


@dataclass
class Keys:
    hot: str
    spread: list[str]
    pairs: collections.Counter[str] = field(default_factory=collections.Counter)
    """Pairs completed per key, over the whole run (what the final check expects)."""


def run_cell(cell: Cell, keys: Keys, pair: Pair, seconds: float) -> Cell:
    """``cell.callers`` threads doing pairs until the deadline; fills in the cell's figures."""
    barrier = threading.Barrier(cell.callers + 1)
    counts: list[collections.Counter[str]] = [collections.Counter() for _ in range(cell.callers)]
    errors: list[collections.Counter[str]] = [collections.Counter() for _ in range(cell.callers)]
    deadline = [0.0]
    spread = keys.spread

    def caller(i: int) -> None:
        mine, failed = counts[i], errors[i]
        barrier.wait()
        end = deadline[0]
        j = i
        while time.perf_counter() < end:
            key = keys.hot if cell.pattern == "hot" else spread[j % len(spread)]
            j += 1
            try:
                pair(key)
            except Exception as err:  # noqa: BLE001 - every failure is counted by type and shown
                failed[type(err).__name__] += 1
                continue
            mine[key] += 1

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(cell.callers)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    deadline[0] = start + seconds
    barrier.wait()
    for t in threads:
        t.join()
    cell.seconds = time.perf_counter() - start
    for c in counts:
        cell.pairs += c.total()
        keys.pairs.update(c)
    for e in errors:
        cell.errors.update(e)
    return cell


def run_async_cell(cell: Cell, keys: Keys, pair: AsyncPair, seconds: float) -> Cell:
    """:func:`run_cell` with ``cell.callers`` coroutines on one event loop instead of threads
    (the gateway's shape: every call a coroutine on the server's loop)."""
    counts: collections.Counter[str] = collections.Counter()
    spread = keys.spread

    async def caller(i: int, end: float) -> None:
        j = i
        while time.perf_counter() < end:
            key = keys.hot if cell.pattern == "hot" else spread[j % len(spread)]
            j += 1
            try:
                await pair(key)
            except Exception as err:  # noqa: BLE001 - every failure is counted by type and shown
                cell.errors[type(err).__name__] += 1
                continue
            counts[key] += 1

    async def run() -> None:
        start = time.perf_counter()
        await asyncio.gather(*(caller(i, start + seconds) for i in range(cell.callers)))
        cell.seconds = time.perf_counter() - start

    serve_loop(run())
    cell.pairs = counts.total()
    keys.pairs.update(counts)
    return cell


def serve_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on the event loop the gym's server runs on (:data:`SERVE_LOOP`)."""
    if SERVE_LOOP == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def async_pair(ledger: Ledger) -> AsyncPair:
    """The gateway's path now: ``reserve_async`` / ``settle_with_balance_async`` (no worker thread per call)."""
    async def pair(key: str) -> None:
        res = await ledger.reserve_async(key, service="rollout", operation="chat.completions",
                                         estimate_nusd=ESTIMATE, request_id="req_bench", chain_ids=(key,))
        await ledger.settle_with_balance_async(res.id, ACTUAL)

    return pair


def hop_pair(ledger: Ledger) -> AsyncPair:
    """The gateway's path before: the synchronous ledger through a worker thread (``Store.call``) per call."""
    async def pair(key: str) -> None:
        res = await ledger.store.call(partial(ledger.reserve, key, service="rollout", operation="chat.completions",
                                              estimate_nusd=ESTIMATE, request_id="req_bench", chain_ids=(key,)))
        await ledger.store.call(ledger.settle_with_balance, res.id, ACTUAL)

    return pair


def ledger_pair(ledger: Ledger) -> Pair:
    def pair(key: str) -> None:
        res = ledger.reserve(key, service="rollout", operation="chat.completions", estimate_nusd=ESTIMATE,
                             request_id="req_bench", chain_ids=(key,))
        ledger.settle_with_balance(res.id, ACTUAL)

    return pair


class RawPool:
    """A fixed set of driver connections in autocommit, handed out one statement at a time."""

    def __init__(self, connect: Callable[[], Any], size: int, paramstyle: str):
        self.conns: queue.Queue[Any] = queue.Queue()
        self.all = [connect() for _ in range(size)]
        for c in self.all:
            self.conns.put(c)
        self.reserve_sql = RAW_RESERVE.format(p=paramstyle)
        self.settle_sql = RAW_SETTLE.format(p=paramstyle)

    @contextmanager
    def conn(self) -> Iterator[Any]:
        c = self.conns.get()
        try:
            yield c
        finally:
            self.conns.put(c)

    def pair(self, key: str) -> None:
        with self.conn() as c:
            held = c.execute(self.reserve_sql, (ESTIMATE, key, ESTIMATE)).rowcount
        if held != 1:
            raise BudgetExhausted("raw reservation refused")
        with self.conn() as c:
            c.execute(self.settle_sql, (ESTIMATE, ACTUAL, key))

    def close(self) -> None:
        for c in self.all:
            c.close()


def bench_row(key: str, now: datetime) -> dict[str, Any]:
    """A ledger row's values as :class:`Ledger` binds them for one of the bench's calls on ``key``
    at ``now`` (its id made as the ledger makes it)."""
    return {"id": new_ordered_id("res"), "key_id": key, "run_id": key, "service": "rollout",
            "operation": "chat.completions", "model": "teacher", "ref_id": None, "request_id": "req_bench",
            "estimate_nusd": ESTIMATE, "created_at": now, "expires_at": now + LEASE}


def ledger_sql_floor(store: Store, connect: Callable[[], Any], key: str, seconds: float) -> tuple[int, float]:
    """The statements the ledger runs for a run key's reservation and settlement, with their
    transactions, on one bare driver connection, one caller, for ``seconds``: what the 1-caller
    ``async`` cell would reach with none of the gym's Python around its SQL. SQLite: ``BEGIN
    IMMEDIATE``, the hold, the ledger row, ``COMMIT``; ``BEGIN IMMEDIATE``, the close, the key's
    move, ``COMMIT`` (no checkpoint in the timed commits, as the store's checkpointer thread
    takes them off the caller). PostgreSQL: the hold and its row in one statement, the close and
    the move in one, each in its transaction. Binds made as the store makes them
    (``Store.prepared``). Returns (pairs, seconds)."""
    sqlite = store.dialect == "sqlite"
    begin = "BEGIN IMMEDIATE" if sqlite else "BEGIN"
    reserve = [store.prepared(s) for s in ((HOLD, RECORD) if sqlite else (HOLD_AND_RECORD,))]
    settle = [store.prepared(s) for s in ((CLOSE[False, False], MOVE) if sqlite else (CLOSE_AND_MOVE[False, False],))]
    conn = connect()
    cur = conn.cursor()
    if sqlite:
        cur.execute("PRAGMA wal_autocheckpoint=0")
    pairs, end = 0, time.perf_counter() + seconds
    t0 = time.perf_counter()
    try:
        while time.perf_counter() < end:
            now = utcnow()
            row = {**bench_row(key, now), "kid": key, "x": ESTIMATE, "now": now}
            cur.execute(begin)
            for prepared in reserve:
                cur.execute(prepared.sql, prepared.parameters(row))
                if prepared.returns_rows and not cur.fetchall():
                    raise BudgetExhausted("bare reservation refused")
            cur.execute("COMMIT")
            now = utcnow()
            close = {"rid": row["id"], "closing": "settled", "now": now, "charge": ACTUAL,
                     "kid": key, "held": ESTIMATE, "charged": ACTUAL}
            cur.execute(begin)
            for prepared in settle:
                cur.execute(prepared.sql, prepared.parameters(close))
                cur.fetchall()
            cur.execute("COMMIT")
            pairs += 1
        elapsed = time.perf_counter() - t0
    finally:
        if sqlite:
            cur.execute("PRAGMA wal_checkpoint(PASSIVE)")  # untimed: the cells after start from a short WAL
        conn.close()
    return pairs, elapsed


_PAST_ROW = insert(ENTRIES).values({c.name: bindparam(c.name, type_=c.type) for c in ENTRIES.c})
"""A whole ledger row, every column bound (:func:`fill_ledger`)."""


def fill_ledger(store: Store, connect: Callable[[], Any], rows: int, keys: Keys) -> float:
    """``rows`` settled ledger rows over ``keys``' spread keys (their figures left as they are:
    the 0-overspend check reads only the cells' keys), ids made as :class:`Ledger` makes them,
    in one transaction on the bare driver. Returns the seconds it took."""
    prepared = store.prepared(_PAST_ROW)
    conn = connect()
    cur = conn.cursor()
    t0 = time.perf_counter()
    now = utcnow()
    settled = {"actual_nusd": ACTUAL, "overrun_nusd": 0, "status": "settled", "settled_at": now}
    cur.execute("BEGIN")
    try:
        for start in range(0, rows, 10_000):
            cur.executemany(prepared.sql, [prepared.parameters({**bench_row(keys.spread[i % len(keys.spread)], now),
                                                                **settled})
                                           for i in range(start, min(start + 10_000, rows))])
        cur.execute("COMMIT")
    finally:
        conn.close()
    return time.perf_counter() - t0


def sqlite_raw(path: str, settings: StoreSettings) -> Callable[[], Any]:
    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=settings.sqlite_busy_timeout_ms / 1000, isolation_level=None,
                               check_same_thread=False)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", f"busy_timeout={settings.sqlite_busy_timeout_ms}"):
            conn.execute(f"PRAGMA {pragma}")
        return conn

    return connect


def postgres_raw(url: str, schema: str) -> Callable[[], Any]:
    import psycopg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    def connect() -> Any:
        return psycopg.connect(dsn, autocommit=True, options=f"-csearch_path={schema}")

    return connect


def make_keys(store: Store, n: int) -> Keys:
    """``n + 1`` run keys made as ``rsigym keys create`` makes them (a few threads: PostgreSQL
    commits them in groups)."""
    registry, policy = KeyRegistry(store), preset_policy("joint", GymConfig())
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: registry.create(policy=policy, budget_nusd=BUDGET)[0]["id"], range(n + 1)))
    return Keys(hot=ids[0], spread=ids[1:])


def check(store: Store, ledger_keys: Keys, raw_keys: Keys, solo_keys: Keys, hop_keys: Keys,
          async_keys: Keys) -> list[str]:
    """The 0-overspend check; returns the findings (empty: OK)."""
    findings: list[str] = []
    with store.transaction() as s:
        rows = {r.id: (r.budget_nusd, r.spent_nusd, r.reserved_nusd) for r in s.execute(
            select(ApiKey.id, ApiKey.budget_nusd, ApiKey.spent_nusd, ApiKey.reserved_nusd))}
        open_rows = s.scalar(select(func.count()).where(LedgerEntry.status == "reserved"))
        settled = {kid: (n, total) for kid, n, total in s.execute(
            select(LedgerEntry.key_id, func.count(), func.coalesce(func.sum(LedgerEntry.actual_nusd), 0))
            .where(LedgerEntry.status == "settled").group_by(LedgerEntry.key_id))}
    if open_rows:
        findings.append(f"{open_rows} reservations left open")
    for keys, kind in ((ledger_keys, "ledger"), (solo_keys, "solo"), (raw_keys, "raw"), (hop_keys, "hop"),
                       (async_keys, "async")):
        for kid in [keys.hot, *keys.spread]:
            budget, spent, reserved = rows[kid]
            pairs = keys.pairs[kid]
            if budget is not None and spent + reserved > budget:
                findings.append(f"{kind} key {kid}: spent {spent} + reserved {reserved} > budget {budget}")
            if reserved:
                findings.append(f"{kind} key {kid}: {reserved} still reserved")
            if spent != pairs * ACTUAL:
                findings.append(f"{kind} key {kid}: spent {spent} != {pairs} pairs x {ACTUAL}")
            if kind != "raw" and settled.get(kid, (0, 0)) != (pairs, spent):
                findings.append(f"{kind} key {kid}: settled rows (count, sum) {settled.get(kid, (0, 0))} "
                                f"!= ({pairs}, {spent})")
    return findings


def check_ceiling_key(store: Store, key_id: str, who: str = "pgbench") -> list[str]:
    """pgbench's key (or the bare-SQL floor's): every hold it took was settled, whole pairs only
    (no transaction half in)."""
    with store.transaction() as s:
        budget, spent, reserved = s.execute(select(ApiKey.budget_nusd, ApiKey.spent_nusd, ApiKey.reserved_nusd)
                                            .where(ApiKey.id == key_id)).one()
        rows = s.scalar(select(func.count()).where(LedgerEntry.key_id == key_id, LedgerEntry.status == "settled")) or 0
    if reserved or spent != rows * ACTUAL or (budget is not None and spent > budget):
        return [f"{who} key {key_id}: spent {spent}, reserved {reserved}, {rows} settled rows"]
    return []


def server_alone(store: Store, pg_url: str, ceiling_key: str, lone_key: str,
                 seconds: float) -> tuple[float | None, float | None]:
    """The PostgreSQL server alone, on keys of its own: (its pipelined ceiling, one caller's
    ceiling) in pairs/s (bench/_pg_ceiling.py), each run for at least 3 s."""
    took = max(seconds, 3)
    return (server_ceiling(store, pg_url, ceiling_key, ESTIMATE, ACTUAL, took),
            one_caller_ceiling(store, pg_url, lone_key, ESTIMATE, ACTUAL, took))


def one_caller_bound(kind: str, floors: dict[str, tuple[int, float]],
                     lone_ceilings: list[float | None]) -> tuple[float, str] | None:
    """What one caller can make on this machine at most, and what measured it: on PostgreSQL, the
    server's own (the best of pgbench's one-caller runs: two durable commits a pair, no Python:
    a bound for any client that commits as the ledger does); on SQLite, the floor (the ledger's
    statements on the bare driver, with no checkpoint to share the disk with: a bound for these
    statements, not for any schema). None when not measured."""
    if kind == "postgres":
        known = [rate for rate in lone_ceilings if rate is not None]
        return (max(known), "a client with no work of its own (pgbench's C one, two durable commits a pair)") if known else None
    pairs, seconds = floors.get(kind, (0, 0.0))
    return (pairs / seconds, "the ledger's statements on the bare driver (the floor, no checkpoints)") if seconds else None


def profile_one_caller(ledger: Ledger, keys: Keys, seconds: float) -> str:
    pair, key = ledger_pair(ledger), keys.hot
    prof = cProfile.Profile()
    n, end = 0, time.perf_counter() + seconds
    prof.enable()
    while time.perf_counter() < end:
        pair(key)
        n += 1
    prof.disable()
    keys.pairs[key] += n
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(15)
    return f"cProfile, 1 caller, SQLite ledger, {n} pairs (under the profiler):\n{out.getvalue()}"


@contextmanager
def open_store(kind: str, pg_url: str, tmp: Path) -> Iterator[tuple[Store, Callable[[], Any]]]:
    """A migrated store and a connect() for raw driver connections to the same database."""
    # 1,000 caller threads queue for the pool's 40 connections; a wait longer than the default
    # 10 s would be refused (503, fail closed). The gateway never queues there (Store.call admits
    # only as many threads as the pool holds), so the bench waits as long as it takes.
    settings = StoreSettings(pool_timeout_s=600)
    if kind == "sqlite":
        store = Store(sqlite_url(tmp), settings)
        store.migrate()
        try:
            yield store, sqlite_raw(str(tmp / "gym.sqlite3"), settings)
        finally:
            store.dispose()
        return
    with fresh_pg_schema(pg_url) as schema:
        store = Store(pg_url, settings, schema=schema)
        store.migrate()
        try:
            yield store, postgres_raw(pg_url, schema)
        finally:
            store.dispose()


def main() -> None:  # noqa: C901 - a bench's driver: one flat sequence of cells and prints
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per cell (store x pattern x callers x kind)")
    parser.add_argument("--callers", default="1,64,1000")
    parser.add_argument("--keys", type=int, default=1000, help="keys of the spread pattern")
    parser.add_argument("--store", default="sqlite,postgres")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--profile", action="store_true", help="cProfile the 1-caller SQLite ledger run")
    parser.add_argument("--ledger-rows", type=int, default=0,
                        help="settled rows put in the ledger before the cells, on keys of their own: a gym that "
                             "has metered that many calls")
    args = parser.parse_args()
    if args.ledger_rows < 0:
        parser.error("--ledger-rows must be 0 or more")
    callers = [int(c) for c in args.callers.split(",")]
    stores = args.store.split(",")

    load_before = os.getloadavg()[0]
    cells: list[Cell] = []
    checks: dict[str, list[str]] = {}
    ceilings: list[float | None] = []
    lone_ceilings: list[float | None] = []
    ceiling_key = lone_key = ""
    profile = ""
    floors: dict[str, tuple[int, float]] = {}
    for kind in stores:
        with tempfile.TemporaryDirectory(prefix="rsigym-bench-") as tmp, \
                open_store(kind, args.pg_url, Path(tmp)) as (store, connect):
            t0 = time.perf_counter()
            ledger_keys, raw_keys, solo_keys, hop_keys, async_keys = (make_keys(store, args.keys) for _ in range(5))
            print(f"[{kind}] {5 * (args.keys + 1)} keys created in {time.perf_counter() - t0:.1f} s", flush=True)
            if args.ledger_rows:
                took = fill_ledger(store, connect, args.ledger_rows, make_keys(store, 999))
                print(f"[{kind}] {args.ledger_rows:,} settled rows put in the ledger in {took:.1f} s", flush=True)
            ledger = Ledger(store)
            # The same ledger with group commit off (every operation its own commit), on the same
            # database: the in-run before/after of storage/group_commit.py.
            solo_store = Store(store.url, store.settings.model_copy(update={"group_commit_max": 1}), schema=store.schema)
            solo = Ledger(solo_store)
            pool_max = store.settings.pool_size + store.settings.max_overflow
            warm = RawPool(connect, 8, "?" if kind == "sqlite" else "%s")
            for n in (1, 8):  # warm up pools, statement caches and the page cache
                run_cell(Cell(kind, "hot", n, "ledger"), ledger_keys, ledger_pair(ledger), 0.3)
                run_cell(Cell(kind, "hot", n, "raw"), raw_keys, warm.pair, 0.3)
                run_async_cell(Cell(kind, "hot", n, "async"), async_keys, async_pair(ledger), 0.3)
            warm.close()
            prepare_heap()  # the collector as a gym server sets it right before it serves
            if args.profile and kind == "sqlite":
                profile = profile_one_caller(ledger, ledger_keys, args.seconds)
            floor_key = make_keys(store, 0).hot
            floors[kind] = ledger_sql_floor(store, connect, floor_key, args.seconds)
            checks.setdefault(kind, []).extend(check_ceiling_key(store, floor_key, "bare-SQL"))
            if kind == "postgres":  # the server alone, before and after the cells (the box's pace drifts)
                ceiling_key, lone_key = make_keys(store, 0).hot, make_keys(store, 0).hot
                pipelined, lone = server_alone(store, args.pg_url, ceiling_key, lone_key, args.seconds)
                ceilings.append(pipelined)
                lone_ceilings.append(lone)
            for pattern in ("hot", "spread"):
                for n in callers:
                    cell = run_cell(Cell(kind, pattern, n, "ledger"), ledger_keys, ledger_pair(ledger), args.seconds)
                    cells.append(cell)
                    cells.append(run_cell(Cell(kind, pattern, n, "solo"), solo_keys, ledger_pair(solo), args.seconds))
                    raw = RawPool(connect, min(n, pool_max), "?" if kind == "sqlite" else "%s")
                    try:
                        cells.append(run_cell(Cell(kind, pattern, n, "raw"), raw_keys, raw.pair, args.seconds))
                    finally:
                        raw.close()
                    hop = run_async_cell(Cell(kind, pattern, n, "hop"), hop_keys, hop_pair(ledger), args.seconds)
                    now = run_async_cell(Cell(kind, pattern, n, "async"), async_keys, async_pair(ledger), args.seconds)
                    cells += [hop, now]
                    print(f"[{kind}] {pattern:6} {n:5} callers: ledger {cell.rate:9,.0f}/s  "
                          f"solo {cells[-4].rate:9,.0f}/s  raw {cells[-3].rate:9,.0f}/s  "
                          f"coroutines: hop {hop.rate:9,.0f}/s  async {now.rate:9,.0f}/s", flush=True)
            solo_store.dispose()
            checks[kind] += check(store, ledger_keys, raw_keys, solo_keys, hop_keys, async_keys)
            if kind == "postgres":
                pipelined, lone = server_alone(store, args.pg_url, ceiling_key, lone_key, args.seconds)
                ceilings.append(pipelined)
                lone_ceilings.append(lone)
                checks[kind] += check_ceiling_key(store, ceiling_key)
                checks[kind] += check_ceiling_key(store, lone_key, "pgbench one caller")

    print()
    print(f"ledger throughput: reserve+settle pairs/s, {args.seconds:g} s per cell, "
          f"hold {ESTIMATE} nUSD, settle {ACTUAL} nUSD, spread over {args.keys} keys, "
          f"{args.ledger_rows:,} rows in the ledger before the first cell; "
          f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print("threads: one OS thread per caller calling the synchronous ledger; coroutines: one task per caller "
          f"on one event loop ({SERVE_LOOP}, as the gym serves on), as the gateway calls it (hop: through a worker thread per call, the path before; "
          "async: reserve_async / settle_with_balance_async)")
    print(f"{'store':9}{'keys':8}{'callers':>8}{'ledger/s':>12}{'solo/s':>10}{'raw/s':>12}{'ledger/solo':>12}"
          f"{'ledger/raw':>12}{'hop/s':>10}{'async/s':>10}{'async/hop':>10}  errors (ledger | solo | raw | hop | async)")
    by = {(c.store, c.pattern, c.callers, c.kind): c for c in cells}
    for kind in stores:
        for pattern in ("hot", "spread"):
            for n in callers:
                led, solo_cell, raw_cell, hop, now = (by[(kind, pattern, n, k)]
                                                       for k in ("ledger", "solo", "raw", "hop", "async"))
                ratio = led.rate / raw_cell.rate if raw_cell.rate else float("nan")
                gain = led.rate / solo_cell.rate if solo_cell.rate else float("nan")
                speedup = now.rate / hop.rate if hop.rate else float("nan")
                errs = " | ".join(str(dict(c.errors) or 0) for c in (led, solo_cell, raw_cell, hop, now))
                print(f"{kind:9}{pattern:8}{n:8}{led.rate:12,.0f}{solo_cell.rate:10,.0f}{raw_cell.rate:12,.0f}"
                      f"{gain:12.2f}{ratio:12.3f}{hop.rate:10,.0f}{now.rate:10,.0f}{speedup:10.2f}  {errs}")
    goals = {"sqlite": 10_000, "postgres": 3_000}
    print()
    for kind in stores:
        best = max((c for c in cells if c.store == kind and c.kind in ("ledger", "async")), key=lambda c: c.rate)
        worst = min((c for c in cells if c.store == kind and c.kind in ("ledger", "async")), key=lambda c: c.rate)
        met = "met" if worst.rate >= goals[kind] else "NOT met"
        print(f"goal {kind} >= {goals[kind]:,}/s: {met} in every cell (best {best.rate:,.0f}/s at {best.pattern} "
              f"x{best.callers} {best.kind}, worst {worst.rate:,.0f}/s at {worst.pattern} x{worst.callers} {worst.kind})")
        many = [c for c in cells if c.store == kind and c.kind == "async" and c.callers > 1]
        if many:  # the gateway's path under load; a lone caller's cells are bounded by the floor below
            low = min(many, key=lambda c: c.rate)
            print(f"  on the gateway's path (async) with more than one caller: "
                  f"{'met' if low.rate >= goals[kind] else 'NOT met'} in all {len(many)} cells "
                  f"(worst {low.rate:,.0f}/s at {low.pattern} x{low.callers})")
        alone = [c for c in cells if c.store == kind and c.kind == "async" and c.callers == 1]
        bound = one_caller_bound(kind, floors, lone_ceilings)
        if alone and bound is not None:  # what one caller can reach here (see one_caller_bound)
            low, (rate, what) = min(alone, key=lambda c: c.rate), bound
            print(f"  on the gateway's path with one caller: {'met' if low.rate >= goals[kind] else 'NOT met'} "
                  f"(worst {low.rate:,.0f}/s at {low.pattern} x1); one caller's bound on this machine, {what}: "
                  f"{rate:,.0f} pairs/s: the goal is {'within' if rate >= goals[kind] else 'OUT OF'} its reach")
    for kind, (pairs, seconds) in floors.items():
        rate = pairs / seconds if seconds else 0.0
        lone = by[(kind, "hot", 1, "async")].rate if (kind, "hot", 1, "async") in by else float("nan")
        print(f"{kind} floor of one caller: the ledger's own statements and transactions on the bare driver "
              f"(no gym code around them), one key: {rate:,.0f} pairs/s; hot x1 async / floor {lone / rate:.2f}")
    if lone_ceilings:
        shown = " / ".join("no pgbench" if rate is None else f"{rate:,.0f}" for rate in lone_ceilings)
        print(f"postgres one caller's ceiling (pgbench: the ledger's two statements, C client, one connection, "
              f"each in a transaction of its own, committed durably before the next is sent), before / after the "
              f"cells: {shown} pairs/s")
    if ceilings:
        top = max((c for c in cells if c.store == "postgres" and c.kind in ("ledger", "async")), key=lambda c: c.rate)
        known = [rate for rate in ceilings if rate is not None]
        shown = " / ".join("no pgbench" if rate is None else f"{rate:,.0f}" for rate in ceilings)
        versus = f"; best cell ({top.rate:,.0f}/s) / ceiling {top.rate / (sum(known) / len(known)):.2f}" if known else ""
        print(f"postgres server ceiling (pgbench: the ledger's two statements, C client, one connection, pipelined, "
              f"{BATCH} pairs a transaction), before / after the cells: {shown} pairs/s{versus}")
    for kind, findings in checks.items():
        status = "OK (spent+reserved <= budget, 0 reserved, 0 open rows, ledger rows == balances == pairs counted)"
        print(f"0-overspend check {kind}: " + (status if not findings else f"{len(findings)} FINDINGS"))
        for f in findings[:20]:
            print("   ", f)
    if profile:
        print()
        print(profile)


if __name__ == "__main__":
    main()
