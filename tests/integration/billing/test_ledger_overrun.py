"""Overruns on real stores (SQLite file and PostgreSQL): a settlement above its reservation
charges the reservation — the budget holds — and records the excess on the ledger row, for
every ledger user (gateway settlements, training steps, sandbox slices, the reaper)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import update

from billing.ledger import Ledger, StepMeter
from kit.config import LedgerConfig
from services.sandbox.metering import SliceMeter
from storage.store import Store
from storage.tables import LedgerEntry, utcnow
from tests.integration.billing.test_ledger import account, make_key


def test_settle_above_the_reservation_charges_it_and_records_the_overrun(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = Ledger(store)
    root = make_key(store, 1000)
    child = make_key(store, None, parent=root)
    res = ledger.reserve(child, service="rollout", operation="chat.completions", estimate_nusd=300)
    with caplog.at_level(logging.WARNING, logger="rsigym.ledger"):
        charged, balance = ledger.settle_with_balance(res.id, 1_250)
    assert charged == 300 and balance is not None and balance.spent_nusd == 300
    assert account(store, root) == (300, 0) and account(store, child) == (300, 0)
    [row] = ledger.entries(root)
    assert row["status"] == "settled" and row["actual_usd"] == pytest.approx(300e-9)
    assert row["overrun_usd"] == pytest.approx(950e-9)
    assert "overrun" in caplog.text and res.id in caplog.text and "0.000000950" in caplog.text
    # Within the reservation nothing is overrun, and a late second settle records nothing.
    within = ledger.reserve(root, service="rollout", operation="chat.completions", estimate_nusd=300)
    assert ledger.settle(within.id, 299) == 299
    assert ledger.settle(res.id, 10**6) == 0
    rows = {r["id"]: r for r in ledger.entries(root)}
    assert rows[within.id]["overrun_usd"] == 0 and rows[res.id]["overrun_usd"] == pytest.approx(950e-9)


def test_a_budget_is_never_exceeded_by_an_overrun(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, 500)
    res = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=500)
    assert ledger.settle(res.id, 2**40) == 500
    assert account(store, key) == (500, 0)
    assert ledger.balance(key).remaining_nusd == 0
    assert ledger.entries(key)[0]["overrun_usd"] == pytest.approx((2**40 - 500) / 1e9)


def test_step_meter_records_a_step_that_cost_more_than_its_estimate(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, 1000)
    meter = StepMeter(ledger, key, "training", "train_step", ref_id="job_1")
    with meter.step(200) as step:
        step.actual_nusd = 260
    with meter.step(200) as step:
        step.actual_nusd = 150
    assert meter.charged_nusd == 350 and meter.steps == 2
    assert account(store, key) == (350, 0)
    assert [r["overrun_usd"] for r in ledger.entries(key)] == [pytest.approx(60e-9), 0]


def test_sandbox_slices_settle_without_overrun(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, 10**9)
    meter = SliceMeter(ledger, key, (key,), "sbx_1", price_nusd_per_s=14, slice_s=5.0)
    meter.open()
    meter.advance()
    seconds, charged = meter.close()
    rows = ledger.entries(key)
    assert len(rows) == 2 and {r["status"] for r in rows} == {"settled"}
    assert all(r["actual_usd"] <= r["estimate_usd"] and r["overrun_usd"] == 0 for r in rows)
    assert account(store, key) == (charged, 0)


@pytest.mark.parametrize("policy", ["charge", "release"])
def test_reclaimed_reservations_are_not_overruns(store: Store, policy: str) -> None:
    ledger = Ledger(store, LedgerConfig(expired_reservations=policy))
    key = make_key(store, 1000)
    stale = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=600)
    with store.transaction() as s:
        s.execute(update(LedgerEntry).where(LedgerEntry.id == stale.id).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert ledger.reclaim_expired() == 1
    [row] = ledger.entries(key)
    assert row["status"] == "expired" and row["overrun_usd"] == 0
    assert row["actual_usd"] == pytest.approx((600 if policy == "charge" else 0) / 1e9)
    assert account(store, key) == (600 if policy == "charge" else 0, 0)
