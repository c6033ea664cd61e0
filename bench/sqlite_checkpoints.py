"""SQLite checkpoints off the request path: what a reservation and a settlement wait for, with the
store's checkpoint thread and with SQLite's own automatic checkpoint inside a commit.

Two SQLite stores, each in a directory of its own, one key each:
  * **thread** — the store as the gym runs it: its connections leave the WAL to the store's
    checkpoint thread (``[store] sqlite_checkpoint_thread = true``, storage/sqlite_checkpoints.py);
  * **commit** — the baseline: ``sqlite_checkpoint_thread = false``, SQLite's default, where the
    commit that takes the WAL past 1,000 pages copies it back and syncs both files itself.
Both are driven as the gateway drives its ledger: ``reserve_async`` then ``settle_with_balance_async``
from coroutines on one event loop; blocks of pairs alternate between the two stores. First one
caller (each operation timed: p50 / p99 / p99.9 / max), then 64 callers (pairs per second). At the
end: each WAL's largest size, and the 0-overspend check on each key.

    .venv/bin/python bench/sqlite_checkpoints.py [--pairs 3000] [--block 100] [--seconds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import pct
from ledger_throughput import ACTUAL, ESTIMATE, Cell, Keys, async_pair, make_keys, run_async_cell

from billing.ledger import Ledger
from kit.settings import StoreSettings
from storage.store import Store, sqlite_url


@dataclass
class Side:
    name: str
    store: Store
    ledger: Ledger
    key: str
    wal: Path
    reserve: list[float] = field(default_factory=list)
    settle: list[float] = field(default_factory=list)
    pairs: int = 0
    wal_peak: int = 0


def make_side(name: str, thread: bool) -> Side:
    data = Path(tempfile.mkdtemp(prefix=f"rsigym-bench-{name}-"))
    store = Store(sqlite_url(data), StoreSettings(sqlite_checkpoint_thread=thread))
    store.migrate()
    return Side(name, store, Ledger(store), make_keys(store, 0).hot, data / "gym.sqlite3-wal")


async def timed_pairs(side: Side, n: int) -> None:
    for i in range(n):
        t0 = time.perf_counter()
        res = await side.ledger.reserve_async(side.key, service="rollout", operation="chat.completions",
                                              estimate_nusd=ESTIMATE, request_id=f"req_{i}", chain_ids=(side.key,))
        t1 = time.perf_counter()
        await side.ledger.settle_with_balance_async(res.id, ACTUAL)
        t2 = time.perf_counter()
        side.reserve.append(t1 - t0)
        side.settle.append(t2 - t1)
        side.pairs += 1


def concurrent_pairs(side: Side, callers: int, seconds: float) -> float:
    """Pairs per second of ``callers`` coroutines on the side's key (ledger_throughput's async cell)."""
    cell = run_async_cell(Cell(store="sqlite", pattern="hot", callers=callers, kind="async"),
                          Keys(hot=side.key, spread=[]), async_pair(side.ledger), seconds)
    if cell.errors:
        raise SystemExit(f"{side.name}: errors at {callers} callers: {dict(cell.errors)}")
    side.pairs += cell.pairs
    return cell.rate


def watch_wal(sides: list[Side], stop: threading.Event) -> None:
    while not stop.wait(0.005):
        for side in sides:
            try:
                side.wal_peak = max(side.wal_peak, side.wal.stat().st_size)
            except FileNotFoundError:
                pass


def overspend(side: Side) -> str:
    with side.store.engine.connect() as conn:
        spent, reserved, budget = conn.exec_driver_sql(
            "SELECT spent_nusd, reserved_nusd, budget_nusd FROM api_keys WHERE id = ?", (side.key,)).one()
        rows, open_rows = conn.exec_driver_sql(
            "SELECT count(*), sum(status = 'reserved') FROM ledger WHERE key_id = ?", (side.key,)).one()
    ok = spent + reserved <= budget and reserved == 0 and not open_rows and rows == side.pairs \
        and spent == side.pairs * ACTUAL
    return f"{'OK' if ok else 'FAILED'} (spent {spent:,} nUSD = {rows:,} settled pairs x {ACTUAL}, {reserved} reserved)"


def line(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"p50 {pct(ms, 50):6.3f}  p99 {pct(ms, 99):6.3f}  p99.9 {pct(ms, 99.9):6.3f}  max {max(ms):7.3f} ms"
            f"  ({len(ms)} {name})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3000, help="timed pairs per store, one caller")
    parser.add_argument("--block", type=int, default=100, help="pairs per store before switching to the other")
    parser.add_argument("--seconds", type=float, default=2.0, help="per store and round, 64 callers")
    args = parser.parse_args()

    thread, commit = make_side("thread", True), make_side("commit", False)
    sides = [thread, commit]
    stop = threading.Event()
    watcher = threading.Thread(target=watch_wal, args=(sides, stop), daemon=True)
    watcher.start()
    load_before = os.getloadavg()[0]

    async def one_caller() -> None:
        for side in sides:  # warm up: compiled statements, pooled connections
            await timed_pairs(side, 50)
            side.reserve.clear()
            side.settle.clear()
        for i in range(0, args.pairs, args.block):
            for side in sides if (i // args.block) % 2 == 0 else reversed(sides):
                await timed_pairs(side, min(args.block, args.pairs - i))

    checkpointer = thread.store._checkpoints
    assert checkpointer is not None
    runs, started = checkpointer.checkpoints, time.perf_counter()
    asyncio.run(one_caller())
    one_caller_s, one_caller_runs = time.perf_counter() - started, checkpointer.checkpoints - runs
    rates: dict[str, list[float]] = {side.name: [] for side in sides}
    for r in range(4):
        for side in sides if r % 2 == 0 else reversed(sides):
            rates[side.name].append(concurrent_pairs(side, 64, args.seconds / 2))
    stop.set()
    watcher.join()
    print(f"SQLite checkpoints: {args.pairs} timed pairs per store (blocks of {args.block}, alternating), one caller; "
          f"then 64 callers; {os.cpu_count()} CPUs, 1-min load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for side in sides:
        label = "thread (now)" if side is thread else "commit (baseline)"
        print(f"  {label:18s} reserve {line('reservations', side.reserve)}")
        print(f"  {'':18s} settle  {line('settlements', side.settle)}")
        print(f"  {'':18s} 64 callers {sum(rates[side.name]) / len(rates[side.name]):,.0f} pairs/s "
              f"(rounds: {', '.join(f'{r:,.0f}' for r in rates[side.name])});  WAL peak {side.wal_peak / 2**20:.1f} MiB")
    print(f"  the checkpoint thread ran {one_caller_runs} checkpoints in the one-caller phase's "
          f"{one_caller_s:.1f} s ({one_caller_runs / one_caller_s:.1f} a second)")
    for op in ("reserve", "settle"):
        a, b = getattr(thread, op), getattr(commit, op)
        print(f"  ratio thread / commit, {op}: p50 {pct(a, 50) / pct(b, 50):.2f}  p99 {pct(a, 99) / pct(b, 99):.2f}  "
              f"p99.9 {pct(a, 99.9) / pct(b, 99.9):.2f}  max {max(a) / max(b):.2f}")
    r_thread, r_commit = (sum(rates[s.name]) / len(rates[s.name]) for s in sides)
    print(f"  ratio thread / commit, 64 callers pairs/s: {r_thread / r_commit:.2f}")
    for side in sides:
        print(f"  0-overspend {side.name}: {overspend(side)}")
        side.store.dispose()
        shutil.rmtree(side.wal.parent, ignore_errors=True)  # the side's data directory


if __name__ == "__main__":
    main()
