"""A coroutine caller with no company runs its store work on its own event loop's thread
(``GroupCommit.run_async`` on SQLite, storage/group_commit.py): no trip to the writer
thread and back. What that must never do: block the event loop behind another writer (a thread
of this process, or another process holding SQLite's write lock), leave a pooled connection
without its busy timeout, take a burst of callers one by one instead of in batches, or write
anything for a caller that was cancelled or refused."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy.pool import QueuePool

from billing.ledger import Ledger, Reservation
from kit.errors import BudgetExhausted, StoreUnavailable
from kit.settings import StoreSettings
from storage.store import Store, Work, sqlite_url
from tests.integration.billing.test_ledger import account, make_key
from tests.integration.storage.test_group_commit_async import Loop, entries, reserve

HOLD_S = 10.0
"""How long another writer holds its lock at most: the loop must show it is free well before."""


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


def test_a_coroutine_alone_runs_its_work_on_its_loop_and_starts_no_writer_thread(store: Store, loop: Loop) -> None:
    """On SQLite, a lone reservation and its settlement run on the caller's loop (no writer
    thread is started); PostgreSQL, whose round trips would block the loop, always queues."""
    ledger = Ledger(store)
    key = make_key(store, 1_000)

    async def pair() -> tuple[int, Any]:
        held = await reserve(ledger, key, 300)
        return await ledger.settle_with_balance_async(held.id, 200)

    charged, balance = loop.start(pair()).result(30)
    assert charged == 200 and balance is not None and balance.spent_nusd == 200
    assert account(store, key) == (200, 0)
    assert entries(store) == [(300, "settled")]
    if store.dialect == "sqlite":
        assert store.group.inline_units == 2
        assert store.group._writer is None  # noqa: SLF001 - no thread was needed
    else:
        assert not store.group.inline and store.group.inline_units == 0


def reserve_while_blocked(store: Store, loop: Loop, key: str, let_go: Callable[[], None]) -> Reservation:
    """A lone coroutine reserves while something else (already in place) would make it wait.
    Its loop must run on: once the call has queued for the writer thread, the loop signals, and
    only then is the blocker let go (``let_go``). A call stuck on the loop could not let the
    loop signal: the test fails after HOLD_S instead of waiting for ever."""
    loop_ran = threading.Event()

    async def scenario() -> Reservation:
        task = asyncio.ensure_future(reserve(Ledger(store), key, 100))
        while not store.group._leading:  # noqa: SLF001, ASYNC110 - set by another thread: queued, the loop is free
            await asyncio.sleep(0.001)
        loop_ran.set()
        return await task

    pending = loop.start(scenario())
    ran = loop_ran.wait(HOLD_S)
    let_go()
    assert ran, "the event loop was blocked behind another writer"
    held: Reservation = pending.result(30)
    assert held.estimate_nusd == 100 and account(store, key) == (0, 100)
    assert store.group.inline_units == 0
    return held


def test_a_lone_coroutine_never_blocks_its_loop_behind_another_thread_of_the_process(
        sqlite_store: Store, loop: Loop) -> None:
    """Another thread of the gym holds the store's write turn: the lone coroutine's work queues
    for the writer thread instead of waiting on the loop, and is done once the turn is free."""
    store = sqlite_store
    key = make_key(store, 1_000)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.begin():
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert holding.wait(30)
    reserve_while_blocked(store, loop, key, release.set)
    holder.join(30)
    assert not holder.is_alive()


def test_a_lone_coroutine_never_blocks_its_loop_behind_another_process_and_every_connection_keeps_its_wait(
        tmp_path: Path, loop: Loop) -> None:
    """Another process (here: a connection of its own, outside the store) holds SQLite's write
    lock: the lone coroutine's attempt fails at once and its work queues for the writer thread,
    which waits for the lock as the store always has. Only the store's own connection for such
    attempts has no busy timeout: every connection the pool lends waits the configured time."""
    store = Store(sqlite_url(tmp_path), StoreSettings(sqlite_busy_timeout_ms=30_000))
    store.migrate()
    try:
        ledger = Ledger(store)
        key = make_key(store, 1_000)
        other = sqlite3.connect(tmp_path / "gym.sqlite3", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")

        def commit() -> None:
            other.execute("COMMIT")
            other.close()

        reserve_while_blocked(store, loop, key, commit)
        assert loop.start(reserve(ledger, key, 200)).result(30).estimate_nusd == 200  # alone again, lock free
        assert store.group.inline_units == 1
        pooled = [store.engine.raw_connection() for _ in range(cast(QueuePool, store.engine.pool).checkedin())]
        try:
            timeouts = [conn.cursor().execute("PRAGMA busy_timeout").fetchone()[0] for conn in pooled]
        finally:
            for conn in pooled:
                conn.close()
        assert pooled and timeouts == [30_000] * len(pooled)
    finally:
        store.dispose()


def test_a_lone_coroutine_never_blocks_its_loop_waiting_for_a_pooled_connection(tmp_path: Path, loop: Loop) -> None:
    """Every connection the store's pool may hold is out (here: its one): the lone coroutine's
    work queues for the writer thread, which waits for a connection as the store always has."""
    store = Store(sqlite_url(tmp_path), StoreSettings(pool_size=1, max_overflow=0))
    store.migrate()
    try:
        key = make_key(store, 1_000)
        taken = store.engine.raw_connection()
        reserve_while_blocked(store, loop, key, taken.close)
    finally:
        store.dispose()


def test_a_burst_of_coroutines_shares_batches_instead_of_running_one_by_one(sqlite_store: Store) -> None:
    """Callers made ready together (one gather) all queue: none runs alone, they share batches."""
    store, ledger = sqlite_store, Ledger(sqlite_store)
    key = make_key(store, 10_000_000)
    batches = store.group.batches

    async def burst() -> list[Reservation]:
        return list(await asyncio.gather(*(reserve(ledger, key, 10) for _ in range(64))))

    assert len(asyncio.run(burst())) == 64
    assert store.group.inline_units == 0 and store.group.batches > batches
    assert account(store, key) == (0, 640)


def test_a_lone_refusal_writes_nothing_and_a_cancelled_lone_caller_nothing_either(
        sqlite_store: Store, loop: Loop) -> None:
    """A reservation the budget refuses, run on the loop: the caller gets the refusal and
    nothing is held or recorded. A lone caller cancelled before its work ran: nothing either,
    and the next lone caller still runs on its loop (no caller was left counted as in flight)."""
    store, ledger = sqlite_store, Ledger(sqlite_store)
    key = make_key(store, 50)
    with pytest.raises(BudgetExhausted):
        loop.start(reserve(ledger, key, 100)).result(30)
    assert store.group.inline_units == 1
    assert account(store, key) == (0, 0) and entries(store) == []

    async def cancel_at_once() -> bool:
        task = asyncio.ensure_future(reserve(ledger, key, 10))
        await asyncio.sleep(0)  # the task is in its first step, not done
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert loop.start(cancel_at_once()).result(30)
    assert account(store, key) == (0, 0) and entries(store) == []
    assert loop.start(reserve(ledger, key, 20)).result(30).estimate_nusd == 20
    assert store.group.inline_units == 2 and store.group._awaiting == 0  # noqa: SLF001


def test_a_unit_that_fails_on_the_loop_rolls_back_and_reaches_its_caller(sqlite_store: Store, loop: Loop) -> None:
    """An unexpected failure inside a unit run on the loop: its writes are rolled back and the
    caller gets the error, as when the writer thread runs it alone."""
    store = sqlite_store
    key = make_key(store, 1_000)
    ledger = Ledger(store)

    def half_then_fail(work: Work) -> None:
        ledger._hold(key, service="rollout", operation="x", estimate_nusd=100, ref_id=None,  # noqa: SLF001
                     request_id=None, ttl_s=None, chain_ids=None)(work)
        raise RuntimeError("the unit broke after its hold")

    with pytest.raises(RuntimeError, match="broke after its hold"):
        loop.start(store.batched_async(half_then_fail)).result(30)
    assert account(store, key) == (0, 0) and entries(store) == []


def test_a_store_whose_commits_checkpoint_keeps_every_coroutine_off_the_loop(tmp_path: Path) -> None:
    """With the checkpointer thread off, a commit may checkpoint (fsync) itself: no unit runs on
    the loop then."""
    store = Store(sqlite_url(tmp_path), StoreSettings(sqlite_checkpoint_thread=False))
    try:
        store.migrate()
        key = make_key(store, 1_000)
        assert not store.group.inline
        assert asyncio.run(reserve(Ledger(store), key, 100)).estimate_nusd == 100
        assert store.group.inline_units == 0
    finally:
        store.dispose()


def test_the_connection_lone_calls_commit_on_never_waits_and_is_closed_with_the_store(tmp_path: Path) -> None:
    """Lone calls commit on one connection of the store's own, with no busy timeout (the pool's
    keep theirs); disposing of the store closes it, never lends it to anyone else."""
    store = Store(sqlite_url(tmp_path), StoreSettings(sqlite_busy_timeout_ms=30_000))
    store.migrate()
    key = make_key(store, 1_000)
    assert asyncio.run(reserve(Ledger(store), key, 100)).estimate_nusd == 100
    own = store._unwaiting_conn  # noqa: SLF001 - the connection under test
    assert own is not None and own.dbapi_connection is not None
    dbapi = own.dbapi_connection
    assert dbapi.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    store.dispose()
    with pytest.raises(sqlite3.ProgrammingError):
        dbapi.execute("SELECT 1")


def test_a_lone_call_whose_connection_is_lost_is_refused_and_the_next_takes_a_fresh_one(
    sqlite_store: Store, loop: Loop
) -> None:
    """The connection lone calls commit on is lost in the middle of a unit: the caller gets a 503
    (the gym fails closed), nothing of the unit stays, the writer's turn is free again, and the
    next lone call commits on a fresh connection."""
    store = sqlite_store
    key = make_key(store, 1_000)
    ledger = Ledger(store)
    assert loop.start(reserve(ledger, key, 10)).result(30).estimate_nusd == 10
    lost = store._unwaiting_conn  # noqa: SLF001 - the connection under test
    assert lost is not None

    def hold_then_lose_the_connection(work: Work) -> None:
        ledger._hold(key, service="rollout", operation="x", estimate_nusd=100, ref_id=None,  # noqa: SLF001
                     request_id=None, ttl_s=None, chain_ids=None)(work)
        cast(Any, lost).dbapi_connection.close()
        ledger._hold(key, service="rollout", operation="x", estimate_nusd=100, ref_id=None,  # noqa: SLF001
                     request_id=None, ttl_s=None, chain_ids=None)(work)

    with pytest.raises(StoreUnavailable, match="connection was lost"):
        loop.start(store.batched_async(hold_then_lose_the_connection)).result(30)
    assert account(store, key) == (0, 10) and [e for e, _ in entries(store)] == [10]
    assert store._unwaiting_conn is None and not store.in_transaction()  # noqa: SLF001
    assert loop.start(reserve(ledger, key, 20)).result(30).estimate_nusd == 20
    assert store._unwaiting_conn is not None and store._unwaiting_conn is not lost  # noqa: SLF001
    assert account(store, key) == (0, 30) and store.group.inline_units == 3
