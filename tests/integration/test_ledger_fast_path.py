"""The ledger's hot path (prepared statements on a pooled driver connection, ``Store.begin``)
keeps the guarantees of the ORM path: it walks a child's whole chain, refuses a missing key,
rolls back what a failed transaction did, and fails closed when the store cannot answer —
including, on SQLite, when another writer of the same process holds the database too long."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from services.core.errors import NotFound, StoreUnavailable
from services.core.ledger import HOLD, Ledger
from services.core.settings import StoreSettings
from services.core.store import Store, sqlite_url
from services.core.tables import utcnow
from tests.integration.test_ledger import account, make_key


def test_a_grandchild_moves_money_on_its_whole_chain_without_given_ids(store: Store) -> None:
    ledger = Ledger(store)
    root = make_key(store, 1000)
    child = make_key(store, 500, parent=root)
    grandchild = make_key(store, None, parent=child)
    res = ledger.reserve(grandchild, service="rollout", operation="x", estimate_nusd=200)
    assert res.run_id == root
    assert [account(store, k) for k in (root, child, grandchild)] == [(0, 200)] * 3
    assert res.balance is not None and res.balance.remaining_nusd == 300  # the child's 500 binds
    assert ledger.settle_with_balance(res.id, 150)[0] == 150
    assert [account(store, k) for k in (root, child, grandchild)] == [(150, 0)] * 3
    assert ledger.balance(grandchild).remaining_nusd == 350
    with pytest.raises(NotFound):
        ledger.reserve("key_does_not_exist", service="rollout", operation="x", estimate_nusd=1)


def test_work_of_a_failed_transaction_is_rolled_back(store: Store) -> None:
    key = make_key(store, 1000)
    with pytest.raises(RuntimeError), store.begin() as work:
        assert work.one(HOLD, {"kid": key, "x": 400, "now": utcnow()}) == (1000, 0, 400)
        raise RuntimeError("the call failed after the hold")
    assert account(store, key) == (0, 0)


def _sqlite_store(data: Path) -> Store:
    store = Store(sqlite_url(data), StoreSettings(sqlite_busy_timeout_ms=200))
    store.migrate()
    return store


def test_sqlite_locked_by_another_process_refuses_reserve_and_settle(tmp_path: Path) -> None:
    store = _sqlite_store(tmp_path)
    try:
        ledger, key = Ledger(store), make_key(store, 1000)
        res = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100)
        holder = sqlite3.connect(tmp_path / "gym.sqlite3", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(StoreUnavailable):
                ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100)
            with pytest.raises(StoreUnavailable):
                ledger.settle(res.id, 50)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert account(store, key) == (0, 100)  # neither refused call held or charged anything
        assert ledger.settle(res.id, 50) == 50
        assert account(store, key) == (50, 0)
    finally:
        store.dispose()


def test_sqlite_writers_of_one_process_wait_at_most_the_busy_timeout(tmp_path: Path) -> None:
    store = _sqlite_store(tmp_path)
    try:
        ledger, key = Ledger(store), make_key(store, 1000)
        entered, done = threading.Event(), threading.Event()

        def hold_the_database() -> None:
            with store.transaction() as s:
                s.execute(text("SELECT 1"))
                entered.set()
                done.wait(30)

        holder = threading.Thread(target=hold_the_database)
        holder.start()
        try:
            assert entered.wait(30)
            with pytest.raises(StoreUnavailable):
                ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100)
        finally:
            done.set()
            holder.join()
        assert account(store, key) == (0, 0)
        # Writers that queue behind each other are served in turn, none refused.
        errors: list[BaseException] = []

        def pair() -> None:
            try:
                ledger.settle(ledger.reserve(key, service="rollout", operation="x", estimate_nusd=10).id, 7)
            except BaseException as err:  # noqa: BLE001 - collected and asserted below
                errors.append(err)

        callers = [threading.Thread(target=pair) for _ in range(16)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        assert errors == []
        assert account(store, key) == (16 * 7, 0)
    finally:
        store.dispose()
