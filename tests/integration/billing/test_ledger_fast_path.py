"""The ledger's hot path (prepared statements on a pooled driver connection, ``Store.begin``)
keeps the guarantees of the ORM path: it walks a child's whole chain, refuses a missing key,
rolls back what a failed transaction did, and fails closed when the store cannot answer —
including, on SQLite, when another writer of the same process holds the database too long."""

from __future__ import annotations

import sqlite3
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text

from billing.ledger import HOLD, Balance, Ledger, ledger_row
from billing.money import nusd_to_usd
from kit.config import LedgerConfig
from kit.errors import BudgetExhausted, NotFound, StoreUnavailable
from kit.settings import StoreSettings
from storage.store import Store, Work, sqlite_url
from storage.tables import LedgerEntry, utcnow
from tests.integration.billing.test_ledger import account, make_key


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


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every statement the hot path sends (each one a round trip to a server)."""
    sent: list[str] = []
    run = Work._run  # every statement of a unit of work goes through it

    def counted(self: Work, stmt: Any, params: dict[str, Any], i: int) -> Any:
        sent.append(str(stmt))
        return run(self, stmt, params, i)

    monkeypatch.setattr(Work, "_run", counted)
    return sent


def _row(store: Store, reservation_id: str) -> dict[str, Any]:
    with store.transaction() as s:
        entry = s.get(LedgerEntry, reservation_id)
        assert entry is not None
        return ledger_row(entry)


def test_a_root_key_reserves_and_settles_in_one_statement_each_on_postgresql(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL every statement is a round trip: a run key's hold and its ledger row are one
    statement, its close and its key's move another (SQLite keeps two each). What they write is
    the same on both stores: the row, the figures, a refusal that writes nothing, the reaper's
    close of an expired hold."""
    ledger, key = Ledger(store, LedgerConfig(reservation_ttl_s=60)), make_key(store, 1000)
    per_op = 1 if store.dialect == "postgresql" else 2
    sent = _counting(monkeypatch)
    res = ledger.reserve(key, service="rollout", operation="chat", estimate_nusd=600, ref_id="ref_1",
                         request_id="req_1", chain_ids=(key,))
    assert len(sent) == per_op
    assert res.balance == Balance(1000, 0, 600, 400)
    row = _row(store, res.id)
    assert {k: row[k] for k in ("key_id", "run_id", "service", "operation", "ref_id", "request_id", "status",
                                "actual_usd", "overrun_usd", "settled_at")} == {
        "key_id": key, "run_id": key, "service": "rollout", "operation": "chat", "ref_id": "ref_1",
        "request_id": "req_1", "status": "reserved", "actual_usd": None, "overrun_usd": 0.0, "settled_at": None}
    created, expires = (datetime.fromisoformat(row[k]) for k in ("created_at", "expires_at"))
    assert (expires - created).total_seconds() == 60

    sent.clear()
    with pytest.raises(BudgetExhausted):  # 400 left: refused, nothing written
        ledger.reserve(key, service="rollout", operation="chat", estimate_nusd=401, chain_ids=(key,))
    assert account(store, key) == (0, 600)
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 1

    sent.clear()
    assert ledger.settle_with_balance(res.id, 900) == (600, Balance(1000, 600, 0, 400))  # clamped; overrun 300
    assert len(sent) == per_op
    assert _row(store, res.id)["overrun_usd"] == nusd_to_usd(300)
    assert ledger.settle_with_balance(res.id, 100) == (0, None)  # closed once: never charged twice
    assert account(store, key) == (600, 0)

    expired = ledger.reserve(key, service="rollout", operation="chat", estimate_nusd=300, ttl_s=-1)
    assert ledger.reclaim_expired() == 1  # the reaper's close charges the whole estimate
    assert account(store, key) == (900, 0)
    assert _row(store, expired.id)["status"] == "expired"


def test_a_child_key_still_moves_its_whole_chain_when_it_settles(store: Store) -> None:
    """The one-statement close moves only a run's root key; a child's chain is moved after it."""
    ledger = Ledger(store)
    root = make_key(store, 1000)
    child = make_key(store, 500, parent=root)
    res = ledger.reserve(child, service="rollout", operation="x", estimate_nusd=200)
    assert ledger.settle_with_balance(res.id, 120) == (120, Balance(500, 120, 0, 380))
    assert [account(store, k) for k in (root, child)] == [(120, 0), (120, 0)]
    ledger.release(ledger.reserve(child, service="rollout", operation="x", estimate_nusd=50).id)
    assert [account(store, k) for k in (root, child)] == [(120, 0), (120, 0)]
