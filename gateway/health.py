"""``/healthz``'s view of the store, kept off the paths that carry calls.

A probe through :meth:`Store.call` queues behind every ledger and auth call for a thread and a
pooled connection, so under load the health check measured the queue (p99 ~2.9 s in
bench/load.py) rather than the store. Here one probe at a time runs on its own thread limiter
and its own unpooled connection, with a time limit, and its result is reused for ``max_age_s``:
a burst of probes costs one ``SELECT 1`` (on SQLite, taking and dropping the write lock, which is
what a call needs), and a busy pool never makes a healthy store look dead.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from storage.store import Store


class StoreHealth:
    def __init__(self, store: Store, *, max_age_s: float = 0.5, timeout_s: float = 5.0):
        self.max_age_s, self.timeout_s = max_age_s, timeout_s
        self.engine = _probe_engine(store, min(timeout_s, store.settings.sqlite_busy_timeout_ms / 1000))
        self._write_probe = self.engine.dialect.name == "sqlite"
        self._limiter = anyio.CapacityLimiter(1)
        self._lock: anyio.Lock | None = None
        self._checked_at = float("-inf")
        self._ok = False

    def _probe(self) -> None:
        with self.engine.connect() as conn:
            if self._write_probe:  # SQLite answers SELECT 1 without the file: take the write lock as a call would
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                conn.exec_driver_sql("ROLLBACK")
            else:
                conn.execute(text("SELECT 1"))

    async def ok(self) -> bool:
        """The store answered a probe within ``timeout_s``, at most ``max_age_s`` ago."""
        if time.monotonic() - self._checked_at < self.max_age_s:
            return self._ok
        if self._lock is None:  # created on the serving loop, not at build time
            self._lock = anyio.Lock()
        async with self._lock:
            if time.monotonic() - self._checked_at < self.max_age_s:
                return self._ok  # another request's probe just finished
            try:
                with anyio.fail_after(self.timeout_s):
                    await anyio.to_thread.run_sync(self._probe, limiter=self._limiter, abandon_on_cancel=True)
                ok = True
            except Exception:  # noqa: BLE001 - any failure to answer is "unreachable"
                ok = False
            self._ok, self._checked_at = ok, time.monotonic()
            return ok

    def dispose(self) -> None:
        self.engine.dispose()


def _probe_engine(store: Store, timeout_s: float) -> Engine:
    url = store.engine.url
    connect_args: dict[str, Any]
    if url.get_backend_name() == "sqlite":
        connect_args = {"check_same_thread": False, "timeout": timeout_s, "isolation_level": None}
    else:
        connect_args = {"connect_timeout": max(1, int(timeout_s))}
    return create_engine(url, poolclass=NullPool, connect_args=connect_args)
