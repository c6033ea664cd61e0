"""The gateway's principal cache: who a key is and what its chain may do, for a short while.

Authentication is on every call's path (hash, then the key and its ancestors from the store),
so a replica keeps recent answers — keyed by the key's SHA-256, never the key — for at most
``ttl_s`` after the store read they came from. Budgets are not here: money is decided by the
ledger's atomic SQL on every call.

Staleness rules (a revoked, paused or narrowed key must stop working everywhere within 1 s):

* every announced key change (:mod:`access.fanout`) drops each entry whose chain holds
  that key — a parent's revocation drops its descendants too;
* the cache serves only while announcements can reach it (:attr:`live`): with Redis, while
  the subscription is confirmed; without Redis, only on SQLite (embedded: one process, whose
  own changes are announced locally). Losing the subscription drops everything and turns the
  cache off; regaining it drops everything again (messages may have been missed meanwhile);
* a read that was in flight while any change was announced is not cached (it may predate
  the change): the cache's generation counter moves on every drop;
* whatever else happens, an entry expires ``ttl_s`` after its read began.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from access.fanout import KeyEvent, KeyEvents, Subscriber
from access.keys import Principal
from kit.settings import PrincipalCacheSettings

log = logging.getLogger("rsigym.gateway")


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    expires_at: float


class PrincipalCache:
    """A bounded (LRU), expiring map of cache key → Principal; thread-safe."""

    def __init__(self, settings: PrincipalCacheSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings or PrincipalCacheSettings()
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._generation = 0
        self._live = False

    @property
    def enabled(self) -> bool:
        return self.settings.ttl_s > 0

    @property
    def live(self) -> bool:
        return self._live

    def __len__(self) -> int:
        return len(self._entries)

    def begin(self) -> tuple[int, float]:
        """Call before a store read: the token :meth:`put` needs to store its result."""
        with self._lock:
            return self._generation, self._clock()

    def get(self, cache_key: str) -> Principal | None:
        if not self._live:
            return None
        with self._lock:
            entry = self._entries.get(cache_key)
            if entry is None:
                return None
            if entry.expires_at <= self._clock():
                del self._entries[cache_key]
                return None
            self._entries.move_to_end(cache_key)
            return entry.principal

    def put(self, cache_key: str, principal: Principal, token: tuple[int, float]) -> bool:
        """Store a principal read after :meth:`begin` returned ``token``; refused (False) when
        the cache is off or a change was announced since."""
        generation, started = token
        if not self.enabled:
            return False
        with self._lock:
            if not self._live or generation != self._generation:
                return False
            self._entries[cache_key] = _Entry(principal, started + self.settings.ttl_s)
            self._entries.move_to_end(cache_key)
            while len(self._entries) > self.settings.max_entries:
                self._entries.popitem(last=False)
            return True

    def on_event(self, event: KeyEvent | None) -> None:
        """A key change was announced (None: an unreadable announcement — drop everything)."""
        with self._lock:
            self._generation += 1
            if event is None:
                self._entries.clear()
                return
            stale = [k for k, e in self._entries.items() if event.key_id in e.principal.chain_ids]
            for k in stale:
                del self._entries[k]

    def set_live(self, live: bool) -> None:
        """Whether announcements reach this cache. Any change of state drops every entry."""
        with self._lock:
            self._generation += 1
            self._entries.clear()
            if live != self._live:
                log.info("principal cache %s", "on" if live else "off (key changes cannot reach it)")
            self._live = live


class PrincipalFanout:
    """Wires a cache to the key-change announcements of its store.

    The in-process listener is attached at once (so an app served without its lifespan is
    still invalidated by its own changes); the Redis subscriber thread runs between
    :meth:`start` and :meth:`stop` (the gateway lifespan)."""

    def __init__(self, cache: PrincipalCache, events: KeyEvents, *, dialect: str):
        self.cache, self.events = cache, events
        self._subscriber: Subscriber | None = None
        events.add_listener(cache.on_event)
        if not events.remote and dialect == "sqlite":
            cache.set_live(True)

    def start(self) -> None:
        if self.events.remote and self.cache.enabled and self._subscriber is None:
            self._subscriber = self.events.subscriber(self.cache.set_live).start()

    def stop(self) -> None:
        if self._subscriber is not None:
            self._subscriber.stop()
            self._subscriber = None
        if self.events.remote:
            self.cache.set_live(False)
