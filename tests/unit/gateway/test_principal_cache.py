"""The gateway's principal cache: bounded, expiring, dropped by key-change announcements, and
never serving longer than its TTL even when the announcements cannot get through."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from access.fanout import KeyEvent, KeyEvents, Subscriber
from access.keys import KeyRegistry, Principal
from access.presets import preset_policy
from gateway.principals import PrincipalCache, PrincipalFanout
from kit.config import GymConfig
from kit.errors import KeyRevoked
from kit.settings import PrincipalCacheSettings, RedisSettings, StoreSettings
from storage.store import Store, sqlite_url
from tests.fakes.servers import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def principal(*chain: str) -> Principal:
    return Principal(key_id=chain[-1], run_id=chain[0], chain_ids=chain, policies=(), track=None)


def live_cache(ttl: float = 2.0, max_entries: int = 100) -> tuple[PrincipalCache, Clock]:
    clock = Clock()
    cache = PrincipalCache(PrincipalCacheSettings(ttl_s=ttl, max_entries=max_entries), clock=clock)
    cache.set_live(True)
    return cache, clock


def test_an_entry_expires_ttl_after_the_read_began() -> None:
    cache, clock = live_cache(ttl=2.0)
    token = cache.begin()
    clock.now += 0.5  # the store read took 0.5 s: the entry's life counts from before it
    assert cache.put("k", principal("key_a"), token)
    clock.now += 1.49
    assert cache.get("k") == principal("key_a")
    clock.now += 0.01
    assert cache.get("k") is None


def test_an_announcement_drops_the_key_and_every_key_minted_from_it() -> None:
    cache, _ = live_cache()
    for name, chain in {"root": ("key_r",), "child": ("key_r", "key_c"), "grandchild": ("key_r", "key_c", "key_g"),
                        "other": ("key_o",)}.items():
        cache.put(name, principal(*chain), cache.begin())
    cache.on_event(KeyEvent("key.revoked", "key_c"))
    assert cache.get("root") is not None and cache.get("other") is not None
    assert cache.get("child") is None and cache.get("grandchild") is None
    cache.on_event(None)  # an unreadable announcement drops everything
    assert len(cache) == 0


def test_a_read_that_overlapped_an_announcement_is_not_cached() -> None:
    """The read may have seen the row before the change committed: caching it would serve the
    old status for a whole TTL after the announcement."""
    cache, _ = live_cache()
    token = cache.begin()
    cache.on_event(KeyEvent("key.paused", "key_unrelated_or_not"))
    assert not cache.put("k", principal("key_a"), token)
    assert cache.get("k") is None
    assert cache.put("k", principal("key_a"), cache.begin())


def test_off_unless_announcements_can_reach_it() -> None:
    cache = PrincipalCache(PrincipalCacheSettings(ttl_s=30))
    assert not cache.put("k", principal("key_a"), cache.begin())  # not live yet
    cache.set_live(True)
    assert cache.put("k", principal("key_a"), cache.begin())
    cache.set_live(False)  # subscription lost: everything goes, nothing is served or stored
    assert cache.get("k") is None and not cache.put("k", principal("key_a"), cache.begin())
    cache.set_live(True)  # back: messages may have been missed, so it starts empty
    assert cache.get("k") is None
    disabled = PrincipalCache(PrincipalCacheSettings(ttl_s=0))
    disabled.set_live(True)
    assert not disabled.put("k", principal("key_a"), disabled.begin())


def test_bounded_least_recently_used_first() -> None:
    cache, _ = live_cache(max_entries=3)
    for name in "abc":
        cache.put(name, principal(f"key_{name}"), cache.begin())
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("d", principal("key_d"), cache.begin())
    assert len(cache) == 3 and cache.get("b") is None and cache.get("a") is not None


def test_wiring_by_store_kind() -> None:
    """Embedded SQLite (one process, local announcements): on at once. PostgreSQL without
    Redis (other replicas' changes would go unheard): never on."""
    sqlite = PrincipalCache()
    PrincipalFanout(sqlite, KeyEvents(RedisSettings(url=None)), dialect="sqlite")
    assert sqlite.live
    pg = PrincipalCache()
    fanout = PrincipalFanout(pg, KeyEvents(RedisSettings(url=None)), dialect="postgresql")
    fanout.start()
    assert not pg.live
    fanout.stop()


def _unreachable_redis() -> RedisSettings:
    return RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.5)


def test_redis_unreachable_the_ttl_still_bounds_staleness(tmp_path: Path) -> None:
    """Replica B cached a key while its subscription was up; then Redis became unreachable and
    the revocation made on replica A could not be announced. A's revoke still succeeds, and B
    serves the key at most TTL after its read — then the store refuses it."""
    redis_down = _unreachable_redis()
    store_a = Store(sqlite_url(tmp_path), StoreSettings(), key_events=KeyEvents(redis_down))
    store_a.migrate()
    store_b = Store(sqlite_url(tmp_path), StoreSettings(), key_events=KeyEvents(redis_down))
    try:
        registry_a, registry_b = KeyRegistry(store_a), KeyRegistry(store_b)
        view, plaintext = registry_a.create(policy=preset_policy("joint", GymConfig()), budget_nusd=10**9)
        cache_b, clock = live_cache(ttl=2.0)  # as if B's subscriber had not yet noticed the outage
        token = cache_b.begin()
        cache_b.put("k", registry_b.authenticate(plaintext), token)

        clock.now += 0.5
        assert registry_a.set_status(view["id"], "revoked")["status"] == "revoked"  # publish failed, logged
        assert cache_b.get("k") is not None  # the announcement never came: stale, within the TTL
        clock.now += 1.5
        assert cache_b.get("k") is None  # exactly TTL after the read: gone
        with pytest.raises(KeyRevoked):
            registry_b.authenticate(plaintext)
    finally:
        store_a.dispose()
        store_b.dispose()


def test_a_subscriber_that_cannot_reach_redis_never_turns_the_cache_on() -> None:
    states: list[bool] = []
    reported = threading.Event()

    def on_state(live: bool) -> None:
        states.append(live)
        reported.set()

    subscriber = Subscriber(_unreachable_redis(), lambda _event: None, on_state).start()
    try:
        assert reported.wait(10), "the subscriber never reported its connection state"
    finally:
        subscriber.stop()
    assert states and not any(states)
