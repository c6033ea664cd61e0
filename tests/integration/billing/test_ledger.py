"""The ledger on real stores (SQLite file and PostgreSQL): money is never created,
lost, double-charged or driven below zero."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from access.keys import KeyRegistry
from access.presets import preset_policy
from billing.ledger import Ledger, StepMeter
from kit.config import GymConfig, LedgerConfig
from kit.errors import BudgetExhausted, KeyPaused, KeyRevoked
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry, utcnow


def make_key(store: Store, budget: int | None, parent: str | None = None) -> str:
    view, _ = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=budget, parent_id=parent)
    return view["id"]


def account(store: Store, key_id: str) -> tuple[int, int]:
    with store.transaction() as s:
        row = s.get(ApiKey, key_id)
        return row.spent_nusd, row.reserved_nusd


def ledger_sum(store: Store, run_id: str) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.coalesce(func.sum(LedgerEntry.actual_nusd), 0)).where(LedgerEntry.run_id == run_id)))


def test_reserve_settle_release_move_money_exactly(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, 1000)
    a = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=400)
    b = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=500)
    assert account(store, key) == (0, 900)
    with pytest.raises(BudgetExhausted):
        ledger.reserve(key, service="rollout", operation="x", estimate_nusd=101)
    assert ledger.settle(a.id, 250) == 250
    ledger.release(b.id)
    assert account(store, key) == (250, 0)
    assert ledger.balance(key).remaining_nusd == 750
    assert ledger_sum(store, key) == 250


def test_settle_is_clamped_and_never_twice(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, 1000)
    res = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=300)
    assert ledger.settle(res.id, 10_000) == 300  # never above the reservation
    assert ledger.settle(res.id, 300) == 0  # a second settle charges nothing
    ledger.release(res.id)  # nor does a late release give money back
    assert account(store, key) == (300, 0)
    assert ledger_sum(store, key) == 300


def test_ledger_rows_are_numbered_in_the_order_they_were_made(store: Store) -> None:
    """New rows go to the end of the ledger's primary-key index, not to a random leaf (what
    keeps a batch's commit small as the ledger grows: kit/ids.py), on the gateway's
    path as on the workers'."""
    ledger = Ledger(store)
    key = make_key(store, 1000)
    made = []
    for i in range(12):
        if i % 2:
            made.append(ledger.reserve(key, service="rollout", operation="x", estimate_nusd=1).id)
        else:
            made.append(asyncio.run(ledger.reserve_async(key, service="rollout", operation="x", estimate_nusd=1)).id)
        time.sleep(0.002)
    with store.transaction() as s:
        by_id = s.scalars(select(LedgerEntry.id).where(LedgerEntry.key_id == key).order_by(LedgerEntry.id)).all()
        by_time = s.scalars(select(LedgerEntry.id).where(LedgerEntry.key_id == key).order_by(LedgerEntry.created_at)).all()
    assert list(by_id) == list(by_time) == made


def test_concurrent_reservations_never_overspend(store: Store) -> None:
    """200 threads race for a budget that covers exactly 50 holds."""
    ledger = Ledger(store)
    key = make_key(store, 50 * 7)
    wins: list[str] = []
    refusals: list[Exception] = []
    barrier = threading.Barrier(40)

    def worker(n: int) -> None:
        if n < 40:
            barrier.wait()
        try:
            res = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=7)
            wins.append(res.id)
            ledger.settle(res.id, 7)
        except BudgetExhausted as err:
            refusals.append(err)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 50 and len(refusals) == 150
    assert account(store, key) == (350, 0)
    assert ledger_sum(store, key) == 350


def test_child_spends_count_against_parent_and_sub_budget(store: Store) -> None:
    ledger = Ledger(store)
    root = make_key(store, 1000)
    child = make_key(store, 300, parent=root)
    open_child = make_key(store, None, parent=root)  # no sub-budget: only the root's applies
    ledger.settle(ledger.reserve(child, service="rollout", operation="x", estimate_nusd=300).id, 300)
    with pytest.raises(BudgetExhausted):
        ledger.reserve(child, service="rollout", operation="x", estimate_nusd=1)
    ledger.settle(ledger.reserve(open_child, service="rollout", operation="x", estimate_nusd=700).id, 700)
    with pytest.raises(BudgetExhausted):
        ledger.reserve(root, service="rollout", operation="x", estimate_nusd=1)
    assert account(store, root) == (1000, 0)
    assert ledger.balance(open_child).remaining_nusd == 0
    assert ledger_sum(store, root) == 1000
    assert sum(r["actual_usd"] for r in ledger.entries(root)) == pytest.approx(1000 / 1e9)


def test_revoked_or_paused_ancestor_blocks_reservation(store: Store) -> None:
    ledger, registry = Ledger(store), KeyRegistry(store)
    root = make_key(store, 1000)
    child = make_key(store, None, parent=root)
    registry.set_status(root, "paused")
    with pytest.raises(KeyPaused):
        ledger.reserve(child, service="rollout", operation="x", estimate_nusd=1)
    registry.set_status(root, "revoked")
    with pytest.raises(KeyRevoked):
        ledger.reserve(child, service="rollout", operation="x", estimate_nusd=1)
    assert account(store, root) == (0, 0)


@pytest.mark.parametrize("policy", ["charge", "release"])
def test_expired_reservations_of_crashed_holders_are_reclaimed(store: Store, policy: str) -> None:
    ledger = Ledger(store, LedgerConfig(expired_reservations=policy))
    key = make_key(store, 1000)
    stale = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=600)
    live = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100)
    with store.transaction() as s:  # the holder of `stale` crashed long ago
        s.execute(update(LedgerEntry).where(LedgerEntry.id == stale.id).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert ledger.reclaim_expired() == 1
    assert ledger.reclaim_expired() == 0
    spent, reserved = account(store, key)
    assert reserved == 100  # the live hold is untouched
    assert spent == (600 if policy == "charge" else 0)
    assert ledger.settle(stale.id, 600) == 0  # a late settle by the "dead" holder moves nothing
    assert ledger.settle(live.id, 50) == 50
    assert ledger_sum(store, key) == account(store, key)[0]


def test_step_meter_stops_before_the_step_it_cannot_pay(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, 1000)
    meter = StepMeter(ledger, key, "training", "train_step", ref_id="job_1")
    performed = 0
    with pytest.raises(BudgetExhausted):
        while True:
            with meter.step(300) as step:
                performed += 1
                step.actual_nusd = 300
    assert performed == 3 and meter.steps == 3
    assert account(store, key) == (900, 0)
    assert [r["ref_id"] for r in ledger.entries(key)] == ["job_1"] * 3


def test_step_meter_releases_a_failed_step_that_did_no_work(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, 1000)
    meter = StepMeter(ledger, key, "training", "train_step")
    with pytest.raises(RuntimeError), meter.step(300):
        raise RuntimeError("data loader broke")
    with pytest.raises(RuntimeError), meter.step(300) as step:
        step.performed, step.actual_nusd = True, 120
        raise RuntimeError("crashed after the GPU ran")
    assert account(store, key) == (120, 0)
