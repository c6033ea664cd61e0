"""A run's clock at the gateway (access/keys.py, billing/deadlines.py): a launched run is
``created`` until its supervisor reports the agent started (the deadline then counts from the
start); a pause stops the clock and resuming pushes the deadline back by the pause's length; the
reaper never ends a paused run whose deadline passed only during its pause."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from access.keys import KeyRegistry
from access.policy import Policy
from billing.deadlines import claim_expired_runs
from kit.errors import Conflict
from storage.store import Store
from storage.tables import ApiKey, utcnow
from tests.conftest import admin_headers, bearer, client_for

HOUR = timedelta(hours=1)


def _run(registry: KeyRegistry, *, launched: bool = True, ends_in: timedelta = HOUR) -> str:
    view, _ = registry.create(policy=Policy(), budget_nusd=10**9, ends_at=utcnow() + ends_in,
                              run={"task": "t", "agent": "scripted", "agent_version": "1"} if launched else None)
    return str(view["id"])


def _shift(store: Store, key_id: str, **columns: Any) -> None:
    """Move a key's clock columns into the past (what time passing does)."""
    with store.transaction() as s:
        s.execute(update(ApiKey).where(ApiKey.id == key_id).values(**columns)
                  .execution_options(synchronize_session=False))


def _row(store: Store, key_id: str) -> ApiKey:
    with store.transaction() as s:
        row = s.get(ApiKey, key_id)
        assert row is not None
        s.expunge(row)
        return row


def test_created_until_started_and_the_clock_counts_from_the_start(store: Store) -> None:
    registry = KeyRegistry(store)
    run = _run(registry)
    assert registry.get(run)["state"] == "created"
    created = _row(store, run)
    _shift(store, run, created_at=created.created_at - timedelta(minutes=5))  # the launch took 5 minutes
    started = registry.start_run(run)
    assert started["state"] == "running" and started["started_at"]
    after = _row(store, run)
    assert after.ends_at is not None and created.ends_at is not None
    assert abs((after.ends_at - created.ends_at) - timedelta(minutes=5)) < timedelta(seconds=5)
    again = registry.start_run(run)  # the first report stands
    assert again["started_at"] == started["started_at"] and _row(store, run).ends_at == after.ends_at
    assert registry.get(_run(registry, launched=False))["state"] == "running"  # a key minted by hand


def test_a_pause_stops_the_clock_and_resuming_pushes_the_deadline(store: Store) -> None:
    registry = KeyRegistry(store)
    run = _run(registry, ends_in=timedelta(minutes=10))
    registry.start_run(run)
    paused = registry.set_status(run, "paused")
    assert paused["state"] == "paused" and paused["paused_at"]
    before = _row(store, run)
    assert before.ends_at is not None and before.paused_at is not None
    # 45 minutes pass while paused: far past the deadline on the wall, not on the run's clock
    _shift(store, run, paused_at=before.paused_at - timedelta(minutes=45),
           ends_at=before.ends_at - timedelta(minutes=45))
    shown = registry.get(run)
    assert shown["state"] == "paused" and 9 * 60 < shown["time_left_s"] <= 10 * 60
    assert claim_expired_runs(store) == []  # the reaper leaves it alone
    resumed = registry.set_status(run, "active")
    assert resumed["state"] == "running" and resumed["paused_at"] is None
    assert 9 * 60 < resumed["time_left_s"] <= 10 * 60
    assert claim_expired_runs(store) == []


def test_a_pause_after_the_deadline_does_not_reopen_the_run(store: Store) -> None:
    registry = KeyRegistry(store)
    run = _run(registry, ends_in=timedelta(minutes=10))
    _shift(store, run, ends_at=utcnow() - timedelta(seconds=1))
    registry.set_status(run, "paused")
    assert registry.get(run)["state"] == "ended (deadline)"
    assert [r for r, _ in claim_expired_runs(store)] == [run]
    resumed = registry.set_status(run, "active")
    assert resumed["state"] == "ended (deadline)" and resumed["time_left_s"] == 0


def test_child_keys_have_no_clock_of_their_own(store: Store) -> None:
    registry = KeyRegistry(store)
    run = _run(registry)
    child, _ = registry.create(policy=Policy(), budget_nusd=10**8, parent_id=run)
    assert registry.set_status(child["id"], "paused")["paused_at"] is None  # the run's clock, not the child's
    with pytest.raises(Conflict):
        registry.start_run(child["id"])


def test_the_admin_route_starts_a_run_and_a_paused_run_is_refused(gym: Any) -> None:
    client = client_for(gym)
    made = client.post("/admin/v1/keys", headers=admin_headers(),
                       json={"track": "joint", "budget_usd": 1, "deadline_s": 600,
                             "run": {"task": "joint-arithmetic", "agent": "scripted", "agent_version": "1"}}).json()
    assert made["state"] == "created"
    started = client.post(f"/admin/v1/keys/{made['id']}/start", headers=admin_headers())
    assert started.status_code == 200 and started.json()["state"] == "running"
    client.post(f"/admin/v1/keys/{made['id']}/pause", headers=admin_headers())
    r = client.get("/v1/key", headers=bearer(made["key"]))
    assert r.status_code == 403
    shown = client.get(f"/admin/v1/keys/{made['id']}", headers=admin_headers()).json()
    assert shown["state"] == "paused" and 590 < shown["time_left_s"] <= 600
    assert client.post("/admin/v1/keys/nope/start", headers=admin_headers()).status_code == 404
