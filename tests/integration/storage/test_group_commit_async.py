"""Group commit for callers on an event loop (``GroupCommit.run_async``, the gateway's
reservations and settlements): coroutines queue with no worker thread each, the store's writer
thread leads their batches, and money moves exactly as for thread callers (SQLite file and
PostgreSQL). Batches are built on purpose, as in test_group_commit.py: a first caller is held
inside its work while the others queue behind it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, make_url, select

from billing.ledger import Ledger, Reservation
from kit.errors import BudgetExhausted, StoreUnavailable
from storage import group_commit
from storage.store import Store, Work
from storage.tables import LedgerEntry
from tests.conftest import PG_URL
from tests.integration.billing.test_ledger import account, make_key
from tests.integration.storage.test_group_commit import Callers, held_leader, queued, wait_until


def entries(store: Store) -> list[tuple[int, str]]:
    with store.transaction() as s:
        return sorted(s.execute(select(LedgerEntry.estimate_nusd, LedgerEntry.status)).tuples().all())


class Loop:
    """An event loop in a thread of its own, as the gateway's: coroutines are started on it and
    their outcomes read back (or cancelled) from the test's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def start(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


def reserve(ledger: Ledger, key: str, estimate: int) -> Any:
    return ledger.reserve_async(key, service="rollout", operation="x", estimate_nusd=estimate)


def test_a_thousand_concurrent_coroutines_never_overspend(store: Store) -> None:
    """1,000 reservations at once on a key with room for 600: exactly 600 are held, in batches;
    settling them all at once charges each once; nothing is left reserved or open."""
    ledger = Ledger(store)
    key = make_key(store, 600 * 1_000)
    batches = store.group.batches

    async def run() -> tuple[list[Any], list[Any]]:
        held = await asyncio.gather(*(reserve(ledger, key, 1_000) for _ in range(1_000)), return_exceptions=True)
        made = [r for r in held if isinstance(r, Reservation)]
        settled = await asyncio.gather(*(ledger.settle_with_balance_async(r.id, 700) for r in made))
        return held, settled

    held, settled = asyncio.run(run())
    refused = [r for r in held if not isinstance(r, Reservation)]
    assert len(held) - len(refused) == 600 and all(isinstance(r, BudgetExhausted) for r in refused)
    assert all(charged == 700 for charged, _ in settled)
    assert account(store, key) == (600 * 700, 0)
    assert store.group.batches > batches  # they did share transactions
    with store.transaction() as s:
        assert s.scalar(select(func.count()).where(LedgerEntry.status == "reserved")) == 0
        assert s.scalar(select(func.count()).where(LedgerEntry.status == "settled")) == 600


def test_threads_and_coroutines_share_one_batch_and_the_lead_passes_both_ways(store: Store, loop: Loop) -> None:
    """Behind a thread leader: a coroutine, a thread, a coroutine. The coroutine first in line is
    led by the writer thread, which takes all three in one batch. Then behind a writer-led batch,
    a thread first in line leads the next one itself."""
    ledger = Ledger(store)
    key = make_key(store, 10_000)
    callers = Callers()
    batches = store.group.batches
    with held_leader(store, callers):
        first = loop.start(reserve(ledger, key, 100))
        wait_until(lambda: queued(store) == 1)
        callers.start("thread", lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=200))
        wait_until(lambda: queued(store) == 2)
        last = loop.start(reserve(ledger, key, 300))
        wait_until(lambda: queued(store) == 3)
    callers.join()
    assert callers.errors == {}
    assert first.result(30).estimate_nusd == 100 and last.result(30).estimate_nusd == 300
    assert store.group.batches == batches + 1

    # a coroutine's work holds the lead (on the writer thread); a thread queues first behind it
    store.group.inline = False  # alone, the coroutine would run its (blocking) work on its own loop
    entered, release = threading.Event(), threading.Event()

    def block(_work: Work) -> str:
        entered.set()
        assert release.wait(30)
        return "writer-led"

    blocker = loop.start(store.batched_async(block))
    assert entered.wait(30)
    callers = Callers()
    callers.start("thread", lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=400))
    wait_until(lambda: queued(store) == 1)
    after = loop.start(reserve(ledger, key, 500))
    wait_until(lambda: queued(store) == 2)
    release.set()
    callers.join()
    assert blocker.result(30) == "writer-led" and after.result(30).estimate_nusd == 500
    assert callers.errors == {} and callers.results["thread"].estimate_nusd == 400
    assert account(store, key) == (0, 1_500)


def test_a_batch_wakes_each_event_loop_once_for_all_its_coroutines(
        store: Store, loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a thread leader: 20 coroutines of one loop, a thread, 10 coroutines of another loop,
    all in one batch. Each loop is handed its callers' outcomes once (a hand-over from another
    thread costs a write to the loop's wake-up socket), every caller gets its own reservation,
    and the thread is woken as threads are."""
    ledger = Ledger(store)
    key = make_key(store, 100_000)
    other = Loop()
    handed: list[int] = []
    resolve = group_commit._resolve

    def counted(futures: list[Any]) -> None:
        handed.append(len(futures))
        resolve(futures)

    monkeypatch.setattr(group_commit, "_resolve", counted)
    callers = Callers()
    batches = store.group.batches
    try:
        with held_leader(store, callers):
            first = [loop.start(reserve(ledger, key, 100 + i)) for i in range(20)]
            wait_until(lambda: queued(store) == 20)
            callers.start("thread", lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=50))
            wait_until(lambda: queued(store) == 21)
            second = [other.start(reserve(ledger, key, 200 + i)) for i in range(10)]
            wait_until(lambda: queued(store) == 31)
        callers.join()
        assert [f.result(30).estimate_nusd for f in first] == [100 + i for i in range(20)]
        assert [f.result(30).estimate_nusd for f in second] == [200 + i for i in range(10)]
    finally:
        other.close()
    assert callers.errors == {} and callers.results["thread"].estimate_nusd == 50
    assert store.group.batches == batches + 1
    assert sorted(handed) == [10, 20]
    assert account(store, key) == (0, sum(range(100, 120)) + 50 + sum(range(200, 210)))


def test_a_coroutine_cancelled_before_its_turn_writes_nothing(store: Store, loop: Loop) -> None:
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    callers = Callers()
    with held_leader(store, callers):
        pending = loop.start(reserve(ledger, key, 100))
        wait_until(lambda: queued(store) == 1)
        pending.cancel()
        wait_until(lambda: queued(store) == 0)  # withdrawn from the queue
    callers.join()
    assert pending.cancelled()
    assert account(store, key) == (0, 0) and entries(store) == []


class TakenReservation:
    """A coroutine's reservation of 100 on a key of 1,000, taken into a batch that a thread caller
    ("second") leads and holds inside its own work until :meth:`end_batch`."""

    def __init__(self, store: Store, loop: Loop) -> None:
        self.store, self.key = store, make_key(store, 1_000)
        self.callers = Callers()
        entered, self.release = threading.Event(), threading.Event()

        def block(_work: Work) -> str:
            entered.set()
            assert self.release.wait(30)
            return "second"

        with held_leader(store, self.callers):
            self.callers.start("second", lambda: store.batched(block))
            wait_until(lambda: queued(store) == 1)
            self.caller = loop.start(reserve(Ledger(store), self.key, 100))
            wait_until(lambda: queued(store) == 2)
        assert entered.wait(30)  # "second" leads a batch that holds the reservation too
        assert queued(store) == 0

    def end_batch(self) -> None:
        self.release.set()
        self.callers.join()

    def nothing_held(self) -> None:
        wait_until(lambda: entries(self.store) == [(100, "released")])
        assert account(self.store, self.key) == (0, 0)


def test_a_coroutine_cancelled_after_its_hold_was_taken_leaves_nothing_held(store: Store, loop: Loop) -> None:
    """The caller (a client that hung up) is cancelled while its reservation is inside a running
    batch: the hold is made and committed with the batch, then released — no money stays held
    for a call that will never be settled, and no ledger row stays open."""
    taken = TakenReservation(store, loop)
    taken.caller.cancel()
    taken.end_batch()
    assert taken.caller.cancelled()
    taken.nothing_held()


@pytest.mark.parametrize("first", ["cancellation", "work's end"])
def test_a_cancellation_and_the_works_end_reach_the_loop_in_either_order_and_nothing_stays_held(
        store: Store, loop: Loop, first: str) -> None:
    """The caller's cancellation and the end of its work (taken into a batch) are both handed to
    its event loop from other threads, in either order: the hold is released once, either way.
    The loop is kept busy while both queue up on it, so the order is the test's, not chance's."""
    taken = TakenReservation(store, loop)
    busy, free = threading.Event(), threading.Event()

    def occupy() -> None:
        busy.set()
        free.wait(30)

    loop.loop.call_soon_threadsafe(occupy)
    assert busy.wait(30)  # the loop runs nothing else until `free`
    if first == "cancellation":
        taken.caller.cancel()  # the task's cancellation queues on the loop
    taken.end_batch()  # the batch has ended: its end is queued on the loop
    if first != "cancellation":
        taken.caller.cancel()
    free.set()
    assert taken.caller.cancelled()
    taken.nothing_held()


def test_a_coroutine_that_waits_too_long_is_refused_and_its_work_never_runs(store: Store, loop: Loop) -> None:
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    store.group.wait_s = 0.2
    callers = Callers()
    with held_leader(store, callers):
        late = loop.start(reserve(ledger, key, 100))
        with pytest.raises(StoreUnavailable):
            late.result(30)
        assert queued(store) == 0
    callers.join()
    assert account(store, key) == (0, 0) and entries(store) == []
    assert loop.start(reserve(ledger, key, 100)).result(30).estimate_nusd == 100  # the store goes on


def test_callers_that_wait_too_long_are_each_refused_after_their_own_wait_on_every_loop(
    store: Store, loop: Loop
) -> None:
    """One watch per event loop refuses its callers (not one timer per call): two loops, callers
    arriving at different times behind a stuck leader. Each is refused once its own wait is over,
    not before; a caller that arrives after the others were refused is refused too (the watch is
    armed again), and none of their work ever runs."""
    ledger = Ledger(store)
    key = make_key(store, 10_000)
    store.group.wait_s = 0.4
    other = Loop()
    callers = Callers()
    try:
        with held_leader(store, callers):
            started = {}

            def late(on: Loop, estimate: int) -> Any:
                async def timed() -> float:
                    begun = asyncio.get_running_loop().time()
                    try:
                        await reserve(ledger, key, estimate)
                    except StoreUnavailable:
                        return asyncio.get_running_loop().time() - begun
                    raise AssertionError("a reservation ran behind a stuck leader")
                started[estimate] = on.start(timed())
                return started[estimate]

            late(loop, 1)
            late(other, 2)
            wait_until(lambda: queued(store) == 2)
            threading.Event().wait(0.2)
            late(loop, 3)  # half a wait behind the first on the same loop
            waited = {estimate: future.result(30) for estimate, future in started.items()}
            assert all(0.4 <= w < 0.4 + 0.5 for w in waited.values()), waited
            assert queued(store) == 0
            again = late(other, 4)  # the other loop's watch has fired; a new one refuses this
            assert 0.4 <= again.result(30) < 0.9
            assert queued(store) == 0
        callers.join()
    finally:
        other.close()
    assert account(store, key) == (0, 0) and entries(store) == []


def test_a_caller_cancelled_as_its_wait_runs_out_is_cancelled_and_nothing_else_breaks(
    store: Store, loop: Loop
) -> None:
    """The sweep and a cancellation meet: the caller's task was cancelled (its future is done)
    and, before its coroutine withdraws its work, the sweep finds that work past its wait. The
    sweep leaves it to the coroutine, which ends cancelled (not with an error of the queue's),
    the queue is empty and nothing is held."""
    ledger = Ledger(store)
    key = make_key(store, 10_000)
    group = store.group
    callers = Callers()
    with held_leader(store, callers):
        caller = loop.start(reserve(ledger, key, 100))
        wait_until(lambda: queued(store) == 1)
        task: dict[str, Any] = {}

        def cancel_then_sweep() -> None:  # on the loop: nothing runs between the two
            (unit,) = list(group._queue)  # noqa: SLF001 - the race is built by hand
            running = [t for t in asyncio.all_tasks(loop.loop) if not t.done()]
            for t in running:
                t.cancel()  # the awaited future is cancelled now; the coroutine runs later
            unit.deadline = 0.0  # its wait is over
            group._watches.pop(loop.loop).cancel()  # noqa: SLF001 - the sweep runs now, by hand
            group._watches[loop.loop] = loop.loop.call_later(3600, lambda: None)  # noqa: SLF001
            group._sweep(loop.loop)  # noqa: SLF001
            task["swept"] = True

        loop.loop.call_soon_threadsafe(cancel_then_sweep)
        with pytest.raises(concurrent.futures.CancelledError):
            caller.result(30)
        assert task == {"swept": True} and queued(store) == 0
    callers.join()
    assert account(store, key) == (0, 0) and entries(store) == []
    assert loop.start(reserve(ledger, key, 200)).result(30).estimate_nusd == 200  # the store goes on


BACKEND_PID = select(func.pg_backend_pid())


def test_the_writer_keeps_one_connection_between_batches_and_a_dropped_one_never_fails_a_call(
    pg_store: Store, loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread runs batch after batch on one connection; idle, it gives it back, so a
    connection the server dropped meanwhile is caught by the pool's test, not by a caller. One
    dropped while kept is found lost before anything could commit, and the work runs again on a
    fresh connection: no caller sees it either. (PostgreSQL: SQLite has no server to drop it.)"""
    import psycopg

    store = pg_store
    monkeypatch.setattr(group_commit, "KEEP_IDLE_S", 0.2)
    ledger = Ledger(store)
    key = make_key(store, 10_000)

    def backend() -> int:
        return int(loop.start(store.batched_async(lambda work: work.one(BACKEND_PID, {})[0])).result(30))

    def drop(pid: int) -> None:
        dsn = make_url(PG_URL).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)

    first = backend()
    assert backend() == first  # kept: the same connection for the next batch
    threading.Event().wait(0.6)  # idle past KEEP_IDLE_S: given back to the pool
    drop(first)
    assert loop.start(reserve(ledger, key, 100)).result(30).estimate_nusd == 100  # no caller met it
    assert backend() != first

    kept = backend()
    drop(kept)  # while kept: the next batch meets it, and runs again on a fresh connection
    assert loop.start(reserve(ledger, key, 200)).result(30).estimate_nusd == 200
    assert backend() != kept

    kept = backend()
    drop(kept)  # while kept, met by a batch: it aborts, and its units run again

    async def many() -> list[Reservation]:
        return list(await asyncio.gather(*(reserve(ledger, key, 10) for _ in range(50))))

    assert [r.estimate_nusd for r in loop.start(many()).result(30)] == [10] * 50
    assert backend() != kept
    assert account(store, key) == (0, 100 + 200 + 500)


def test_the_writer_thread_leaves_when_idle_and_a_new_one_serves(
    store: Store, loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_commit, "WRITER_IDLE_S", 0.05)
    store.group.inline = False  # alone, a coroutine's work would run on its own loop, with no writer
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    assert loop.start(reserve(ledger, key, 100)).result(30).estimate_nusd == 100
    wait_until(lambda: store.group._writer is None)  # noqa: SLF001 - the thread it starts and ends
    assert loop.start(reserve(ledger, key, 200)).result(30).estimate_nusd == 200
    assert account(store, key) == (0, 300)


def test_disposing_of_the_store_ends_its_writer_thread_and_closes_its_connection(store: Store, loop: Loop) -> None:
    """A store disposed of (a gym shutting down, a test ending) leaves no writer thread behind
    and no connection of its open: not the writer's kept one, not for its idle minutes."""
    store.group.inline = False  # through the writer thread, as under load
    kept = loop.start(store.batched_async(lambda work: work._conn.dbapi_connection)).result(30)  # noqa: SLF001
    writer = store.group._writer  # noqa: SLF001 - the thread under test
    assert writer is not None and writer.is_alive()
    store.dispose()
    assert not writer.is_alive() and store.group._writer is None  # noqa: SLF001
    with pytest.raises(Exception, match="(?i)closed"):
        kept.cursor().execute("SELECT 1")
