"""The store itself: migrations match the models on both backends; concurrency slots hold
under races; key authentication reads the chain fresh every time."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import update

from access.keys import KeyRegistry
from access.presets import TRACKS, preset_policy
from billing.concurrency import ConcurrencySlots
from kit.config import GymConfig
from kit.errors import AuthenticationFailed, ConcurrencyLimited, KeyRevoked
from storage.store import Store
from storage.tables import Base, ConcurrencyLease, utcnow


def test_migrations_produce_exactly_the_models(store: Store) -> None:
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    store.migrate()  # idempotent


def test_concurrency_cap_holds_under_a_race(store: Store) -> None:
    registry, slots = KeyRegistry(store), ConcurrencySlots(store)
    root, _ = registry.create(policy=preset_policy("joint", GymConfig()), budget_nusd=10)
    child, _ = registry.create(policy=preset_policy("joint", GymConfig()), budget_nusd=None, parent_id=root["id"])
    caps = [(root["id"], 5), (child["id"], 3)]
    got, refused = [], []
    barrier = threading.Barrier(20)

    def take() -> None:
        barrier.wait()
        try:
            got.append(slots.acquire(caps, "sandbox"))
        except ConcurrencyLimited:
            refused.append(1)

    threads = [threading.Thread(target=take) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 3 and len(refused) == 17  # the child's tighter cap binds
    assert slots.in_flight(root["id"], "sandbox") == 3
    for lease in got:
        slots.release(lease)
        slots.release(lease)  # releasing twice gives back nothing more
    assert slots.in_flight(root["id"], "sandbox") == 0 and slots.in_flight(child["id"], "sandbox") == 0


def test_slots_of_crashed_holders_are_reclaimed(store: Store) -> None:
    registry, slots = KeyRegistry(store), ConcurrencySlots(store)
    root, _ = registry.create(policy=preset_policy("joint", GymConfig()), budget_nusd=10)
    lease = slots.acquire([(root["id"], 1)], "rollout")
    with pytest.raises(ConcurrencyLimited):
        slots.acquire([(root["id"], 1)], "rollout")
    with store.transaction() as s:
        s.execute(update(ConcurrencyLease).where(ConcurrencyLease.id == lease).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert slots.reclaim_expired() == 1
    assert slots.acquire([(root["id"], 1)], "rollout")


def test_authentication_sees_a_revoke_immediately(store: Store) -> None:
    registry = KeyRegistry(store)
    view, plaintext = registry.create(policy=preset_policy("offline", GymConfig()), budget_nusd=10, name="run-1")
    assert registry.authenticate(plaintext).key_id == view["id"]
    registry.set_status(view["id"], "revoked")
    with pytest.raises(KeyRevoked):
        registry.authenticate(plaintext)
    with pytest.raises(AuthenticationFailed):
        registry.authenticate(plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B"))


@pytest.mark.parametrize("track", TRACKS)
def test_every_track_preset_is_a_valid_policy(track: str) -> None:
    policy = preset_policy(track, GymConfig())  # no rollout catalogue: offline has no teacher
    assert policy.services
    assert ("rollout" in policy.services) == (track in ("data", "joint"))
    assert ("training" in policy.services) == (track != "harness")


def test_the_sqlite_writer_connection_keeps_a_larger_page_cache_only_while_it_is_kept(sqlite_store: Store) -> None:
    """The group commit's writer connection gets StoreSettings.sqlite_writer_cache_mib while
    the writer keeps it; back in the pool it is an ordinary connection again (SQLite's default),
    so other transactions never hold that much memory each."""
    store = sqlite_store

    def cache_size(conn: Any) -> int:
        cursor = conn.cursor()
        try:
            cursor.execute("PRAGMA cache_size")
            return int(cursor.fetchone()[0])
        finally:
            cursor.close()

    with store.keeping_connection():
        with store.begin() as work:
            kept = work._conn.dbapi_connection  # noqa: SLF001 - the connection the writer keeps
            assert cache_size(kept) == -1024 * store.settings.sqlite_writer_cache_mib
        with store.begin() as work:
            assert work._conn.dbapi_connection is kept  # noqa: SLF001 - still kept between batches
    pooled = store.engine.raw_connection()
    try:
        assert pooled.dbapi_connection is kept  # the same one, back in the pool
        assert cache_size(pooled) == -2000
    finally:
        pooled.close()
    with store.begin() as work:  # an ordinary transaction: the default
        assert cache_size(work._conn) == -2000  # noqa: SLF001
