"""Key-change fan-out: revocations, pauses, resumes, policy edits and top-ups, announced to
every process that caches what a key may do (the gateway replicas' principal caches).

Whoever changes a key (:class:`access.keys.KeyRegistry`, used by the admin routes, the
agent's child-key routes and the evaluation jobs) calls :meth:`KeyEvents.publish` *after* the
change committed. Listeners in the same process hear it at once; with RSIGYM_REDIS_URL the
event also goes out on a Redis pub/sub channel, and a :class:`Subscriber` thread in each
gateway replica hands it to that replica's listeners.

Pub/sub is fire-and-forget: a replica that is not connected misses messages. So the
subscriber reports its connection state, and a cache must only serve entries while it is
connected (and drop everything when it reconnects); the cache's TTL bounds the rest.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kit.settings import RedisSettings

log = logging.getLogger("rsigym.fanout")

EVENT_TYPES = ("key.revoked", "key.paused", "key.resumed", "key.policy", "key.topup")
STATUS_EVENTS = {"revoked": "key.revoked", "paused": "key.paused", "active": "key.resumed"}
"""The event a key status change announces."""


@dataclass(frozen=True)
class KeyEvent:
    type: str
    key_id: str

    def encode(self) -> bytes:
        return json.dumps({"type": self.type, "key_id": self.key_id}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> KeyEvent | None:
        """The event, or None for anything malformed (a listener then drops everything)."""
        try:
            data = json.loads(raw)
        except (TypeError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        kind, key_id = data.get("type"), data.get("key_id")
        if kind not in EVENT_TYPES or not isinstance(key_id, str) or not key_id:
            return None
        return cls(kind, key_id)


Listener = Callable[[KeyEvent | None], None]
"""Called with an event, or None when an undecodable message arrived (drop everything)."""


class KeyEvents:
    """Publishes key changes: to listeners in this process, and on Redis when configured."""

    def __init__(self, settings: RedisSettings | None = None):
        self.settings = settings or RedisSettings()
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._client: redis.Redis | None = None

    @property
    def remote(self) -> bool:
        """True when events reach other processes (RSIGYM_REDIS_URL is set)."""
        return bool(self.settings.url)

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def notify_local(self, event: KeyEvent | None) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(event)

    def publish(self, kind: str, key_id: str) -> None:
        """Announce a committed change. Never raises: the change is already in the store, and
        a replica that misses the message still drops the entry within its cache TTL."""
        if kind not in EVENT_TYPES:
            raise ValueError(f"unknown key event {kind!r}")
        event = KeyEvent(kind, key_id)
        self.notify_local(event)
        if not self.remote:
            return
        try:
            self._redis().publish(self.settings.key_channel, event.encode())
        except (redis.RedisError, OSError) as err:
            log.warning("could not announce %s of %s on Redis (%s); other replicas drop it within their cache TTL",
                        kind, key_id, err)

    def _redis(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                timeout = self.settings.socket_timeout_s
                # One immediate retry: a pooled connection may predate a Redis restart.
                self._client = redis.Redis.from_url(self.settings.url or "", socket_connect_timeout=timeout,
                                                    socket_timeout=timeout, retry=Retry(NoBackoff(), 1))
            return self._client

    def subscriber(self, on_state: Callable[[bool], None]) -> Subscriber:
        """A (not yet started) thread that relays Redis events to this object's listeners."""
        return Subscriber(self.settings, self.notify_local, on_state)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class Subscriber:
    """Listens on the key channel in a daemon thread, reconnecting with backoff.

    ``on_state(True)`` once the subscription is confirmed (every message published from then
    on is delivered), ``on_state(False)`` as soon as the connection is known lost.
    """

    HEALTH_CHECK_S = 2.0
    MAX_BACKOFF_S = 5.0

    def __init__(self, settings: RedisSettings, on_event: Listener, on_state: Callable[[bool], None]):
        if not settings.url:
            raise ValueError("a subscriber needs RSIGYM_REDIS_URL")
        self.settings, self.on_event, self.on_state = settings, on_event, on_state
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rsigym-key-fanout", daemon=True)
        self._pubsub: Any = None

    def start(self) -> Subscriber:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff, down_logged = 0.2, False
        while not self._stop.is_set():
            client = redis.Redis.from_url(
                self.settings.url or "", socket_connect_timeout=self.settings.socket_timeout_s,
                socket_keepalive=True, health_check_interval=self.HEALTH_CHECK_S,
                retry=Retry(NoBackoff(), 0),  # no silent reconnect: a lost connection must reach on_state(False)
            )
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(self.settings.key_channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self.on_state(True)
                        log.info("listening for key changes on Redis channel %s", self.settings.key_channel)
                        backoff, down_logged = 0.2, False
                    elif message["type"] == "message":
                        self.on_event(KeyEvent.decode(message["data"]))
            except (redis.RedisError, OSError) as err:
                self.on_state(False)
                if not down_logged:
                    log.warning("key-change fan-out lost (%s): the principal cache is off until Redis is back", err)
                    down_logged = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.MAX_BACKOFF_S)
            finally:
                try:
                    pubsub.close()
                    client.close()
                except (redis.RedisError, OSError):
                    pass
        self.on_state(False)
