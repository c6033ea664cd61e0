"""Group commit (storage/group_commit.py): concurrent ledger calls share one transaction and
one commit, and nothing about money changes for it (SQLite file and PostgreSQL).

Each test builds a batch on purpose: the first caller leads alone and is held inside its work
(``held_leader``) while the others queue behind it; when it is let go, the next leader takes
every queued unit in one transaction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import exc, func, select

from billing.ledger import HOLD, Ledger
from kit.errors import BudgetExhausted, StoreUnavailable
from storage.store import Store, Work
from storage.tables import LedgerEntry, utcnow
from tests.integration.billing.test_ledger import account, make_key


class Callers:
    """Threads each making one call; their outcomes by name."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}

    def start(self, name: str, call: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.results[name] = call()
            except BaseException as err:  # noqa: BLE001 - the test reads every outcome
                self.errors[name] = err

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=60)
            assert not thread.is_alive(), "a caller never returned"


def queued(store: Store) -> int:
    with store.group._lock:  # noqa: SLF001 - the test waits for the queue it builds
        return len(store.group._queue)  # noqa: SLF001


def wait_until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@contextmanager
def held_leader(store: Store, callers: Callers) -> Iterator[threading.Event]:
    """A first caller that leads alone and waits inside its work until the event is set."""
    entered, release = threading.Event(), threading.Event()

    def block(_work: Work) -> str:
        entered.set()
        assert release.wait(30)
        return "leader"

    callers.start("leader", lambda: store.batched(block))
    assert entered.wait(30)
    try:
        yield release
    finally:
        release.set()


def test_a_refusal_inside_a_batch_leaves_no_hold_and_the_rest_commit(store: Store) -> None:
    """A child key's reservation is refused by its own budget after its parent's hold was taken:
    the parent's hold is given back inside the batch, and the other reservations of the batch
    are committed with the one commit."""
    ledger = Ledger(store)
    parent = make_key(store, 1_000)
    child = make_key(store, 50, parent=parent)
    sibling = make_key(store, 1_000, parent=parent)
    callers = Callers()
    batches = store.group.batches
    with held_leader(store, callers):
        callers.start("a", lambda: ledger.reserve(sibling, service="rollout", operation="x", estimate_nusd=100))
        callers.start("refused", lambda: ledger.reserve(child, service="rollout", operation="x", estimate_nusd=60))
        callers.start("b", lambda: ledger.reserve(child, service="rollout", operation="x", estimate_nusd=40))
        wait_until(lambda: queued(store) == 3)
    callers.join()

    assert isinstance(callers.errors.pop("refused"), BudgetExhausted)
    assert callers.errors == {}
    assert store.group.batches == batches + 1  # the three went together
    assert account(store, parent) == (0, 140)  # 100 + 40: nothing of the refused 60 stayed held
    assert account(store, child) == (0, 40)
    assert account(store, sibling) == (0, 100)
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 2
    for name in ("a", "b"):
        assert ledger.settle(callers.results[name].id, 10) == 10
    assert account(store, parent) == (20, 0)


def test_a_unit_that_fails_after_writing_is_rolled_back_alone(store: Store) -> None:
    """Work that raises an unexpected error after a write aborts the batch: its write is undone,
    its caller gets the error, and the others' reservations are made, each exactly once."""
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    runs = {"broken": 0}

    def broken(work: Work) -> None:
        runs["broken"] += 1
        work.first(HOLD, {"kid": key, "x": 500, "now": utcnow()})
        raise RuntimeError("the work broke after its write")

    callers = Callers()
    with held_leader(store, callers):
        callers.start("a", lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100))
        wait_until(lambda: queued(store) == 1)
        callers.start("broken", lambda: store.batched(broken))
        wait_until(lambda: queued(store) == 2)
        callers.start("b", lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=200))
        wait_until(lambda: queued(store) == 3)
    callers.join()

    assert str(callers.errors.pop("broken")) == "the work broke after its write"
    assert callers.errors == {}
    assert runs["broken"] == 2  # in the batch, then alone (its own outcome)
    assert account(store, key) == (0, 300)  # none of the broken work's 500
    with store.transaction() as s:
        assert sorted(s.scalars(select(LedgerEntry.estimate_nusd)).all()) == [100, 200]


def test_with_work_waiting_a_batchs_callers_are_woken_only_once_it_committed_whatever_the_next_does(
        store: Store) -> None:
    """Under a backlog a batch's callers are woken while the next batch commits
    (GroupCommit._wake_committed), not at once. Each is still woken only after its own batch
    committed (what it was told is in the store, seen from another connection), and even when
    the next batch never commits: there, a unit that fails after its write, alone in its batch."""
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    entered, release = threading.Event(), threading.Event()
    seen: dict[str, str | None] = {}

    def reserve_and_look(name: str, estimate: int) -> Any:
        res = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=estimate)
        with store.transaction() as s:  # a connection of its own: only committed rows
            seen[name] = s.scalar(select(LedgerEntry.status).where(LedgerEntry.id == res.id))
        return res

    def blocking(_work: Work) -> str:
        entered.set()
        assert release.wait(30)
        return "blocked"

    def broken(work: Work) -> None:
        work.first(HOLD, {"kid": key, "x": 500, "now": utcnow()})
        raise RuntimeError("the work broke after its write")

    callers = Callers()
    with held_leader(store, callers):  # batch A: two holds and a unit that holds batch A open
        callers.start("a1", lambda: reserve_and_look("a1", 100))
        wait_until(lambda: queued(store) == 1)
        callers.start("a2", lambda: reserve_and_look("a2", 200))
        wait_until(lambda: queued(store) == 2)
        callers.start("block", lambda: store.batched(blocking))
        wait_until(lambda: queued(store) == 3)
    assert entered.wait(30)
    callers.start("broken", lambda: store.batched(broken))  # batch B, queued while A runs
    wait_until(lambda: queued(store) == 1)
    release.set()
    callers.join()

    assert str(callers.errors.pop("broken")) == "the work broke after its write"
    assert callers.errors == {}
    assert callers.results["block"] == "blocked"
    assert seen == {"a1": "reserved", "a2": "reserved"}  # committed before their callers heard of it
    assert account(store, key) == (0, 300)  # none of the broken work's 500


def test_a_failed_commit_fails_every_call_of_the_batch_closed(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the batch's COMMIT fails, every caller whose work was in it is refused (503), and
    nothing of the batch is in the store."""
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    callers = Callers()
    real_begin = Store.begin

    @contextmanager
    def failing_commit(self: Store) -> Iterator[Work]:
        with real_begin(self) as work:
            yield work
            if threading.current_thread().name == "batch-leader":
                raise exc.OperationalError("COMMIT", {}, Exception("disk I/O error"))

    with held_leader(store, callers) as release:
        for name in ("a", "b", "c"):
            callers.start(name, lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100))
        wait_until(lambda: queued(store) == 3)
        monkeypatch.setattr(Store, "begin", failing_commit)
        for thread in callers.threads[1:]:
            thread.name = "batch-leader"  # whichever of them leads the batch
        release.set()
        callers.join()
    monkeypatch.setattr(Store, "begin", real_begin)

    assert sorted(callers.errors) == ["a", "b", "c"]
    assert all(isinstance(err, StoreUnavailable) for err in callers.errors.values())
    assert account(store, key) == (0, 0)
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 0


def test_a_call_that_waits_too_long_for_its_turn_is_refused_and_never_runs(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    store.group.wait_s = 0.2
    callers = Callers()
    with held_leader(store, callers):
        callers.start("late", lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100))
        callers.threads[1].join(timeout=30)
        assert isinstance(callers.errors.get("late"), StoreUnavailable)
        assert queued(store) == 0
    callers.join()
    assert account(store, key) == (0, 0)
    # The store goes on: the next call leads and runs.
    assert ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100).estimate_nusd == 100


def test_a_reservation_inside_an_open_transaction_does_not_queue(pg_store: Store) -> None:
    """A thread that already holds a transaction and reserves does not queue behind a leader
    (who might need a row it holds, and PostgreSQL cannot see a wait in Python): it runs in a
    transaction of its own, at once, even while another caller leads. (On SQLite a second
    transaction waits for the first one's write lock whatever the ledger does.)"""
    store = pg_store
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    callers = Callers()
    done: list[str] = []

    def nested() -> None:
        with store.transaction():
            done.append(ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100).id)

    with held_leader(store, callers):
        thread = threading.Thread(target=nested, daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive() and len(done) == 1
    callers.join()
    assert account(store, key) == (0, 100)
