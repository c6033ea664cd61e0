"""``/healthz``: the store, each service the gateway forwards to and, where jobs go to Celery, the
broker, each probed for real, kept off the paths that carry calls.

A probe through :meth:`Store.call` queues behind every ledger and auth call for a thread and a
pooled connection, so under load the health check measured the queue (p99 ~2.9 s in
bench/load.py) rather than the store. Here one probe at a time runs on its own thread limiter
and its own unpooled connection, with a time limit, and its result is reused for ``max_age_s``:
a burst of probes costs one ``SELECT 1`` (on SQLite, taking and dropping the write lock, which is
what a call needs), and a busy pool never makes a healthy store look dead.

:class:`GymHealth` adds the parts around the store. A service run as its own server (distributed
mode) is asked for its own ``/healthz`` over its link, a service in this process (embedded mode) is
up by construction; the probes run in parallel, each with a short time limit, and the whole report
is reused for ``max_age_s`` (a load balancer polls it). Any part down makes the answer 503, with
the part and the reason: the operator sees which one, not a bare "ok" while records are gone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from kit.settings import JobSettings, WorkerSettings
from storage.store import Store

if TYPE_CHECKING:
    from gateway.service_link import ServiceLink


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


PartReport = dict[str, str]
"""``{"status": "ok"}`` or ``{"status": "down", "reason": ...}``."""


class GymHealth:
    """Every part ``/healthz`` answers for. ``links``: the services by name; ``broker``: the Celery
    broker's URL when this process sends jobs there (None: jobs run in process)."""

    def __init__(self, store: Store, links: dict[str, ServiceLink], *, broker: str | None = None,
                 max_age_s: float = 1.5, probe_timeout_s: float = 2.0):
        self.store = StoreHealth(store)  # its own time limit: a busy SQLite write lock is not "down"
        self.links, self.broker = links, broker
        self.max_age_s, self.probe_timeout_s = max_age_s, probe_timeout_s
        self._lock: anyio.Lock | None = None
        self._checked_at = float("-inf")
        self._report: dict[str, Any] = {}

    async def report(self) -> tuple[bool, dict[str, Any]]:
        """``(every part up, the body of /healthz)``, probed at most ``max_age_s`` ago."""
        if self._lock is None:  # created on the serving loop, not at build time
            self._lock = anyio.Lock()
        async with self._lock:
            if time.monotonic() - self._checked_at >= self.max_age_s:
                self._report = await self._probe_all()
                self._checked_at = time.monotonic()
        return self._report["status"] == "ok", self._report

    async def _probe_all(self) -> dict[str, Any]:
        services: dict[str, PartReport] = {}
        store: list[bool] = []
        broker: list[PartReport] = []

        async def probe_service(name: str, link: ServiceLink) -> None:
            services[name] = await self._probe_service(link)

        async def probe_store() -> None:
            store.append(await self.store.ok())

        async def probe_broker(url: str) -> None:
            broker.append(await self._probe_broker(url))

        async with anyio.create_task_group() as tg:
            tg.start_soon(probe_store)
            for name, link in self.links.items():
                tg.start_soon(probe_service, name, link)
            if self.broker is not None:
                tg.start_soon(probe_broker, self.broker)
        ok = store[0] and all(p["status"] == "ok" for p in [*services.values(), *broker])
        body: dict[str, Any] = {"status": "ok" if ok else "degraded", "store": "ok" if store[0] else "unreachable",
                                "services": dict(sorted(services.items()))}
        if broker:
            body["broker"] = broker[0]
        return body

    async def _probe_service(self, link: ServiceLink) -> PartReport:
        if link.in_process:
            return {"status": "ok"}  # the service's app runs in this process: up while the gateway is
        try:
            with anyio.fail_after(self.probe_timeout_s):
                response = await link.client.get("/healthz")
        except TimeoutError:
            return _down(f"no answer from {link.client.base_url} within {self.probe_timeout_s:g} s")
        except httpx.HTTPError as err:
            return _down(f"{link.client.base_url} cannot be reached ({type(err).__name__})")
        if response.status_code != 200:
            return _down(f"{link.client.base_url}/healthz answered {response.status_code}")
        return {"status": "ok"}

    async def _probe_broker(self, url: str) -> PartReport:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 6379
        try:
            with anyio.fail_after(self.probe_timeout_s):
                stream = await anyio.connect_tcp(host, port)
            await stream.aclose()
        except TimeoutError:
            return _down(f"the job broker at {host}:{port} did not accept a connection within {self.probe_timeout_s:g} s")
        except OSError as err:
            return _down(f"the job broker at {host}:{port} cannot be reached ({err.strerror or type(err).__name__})")
        return {"status": "ok"}

    def dispose(self) -> None:
        self.store.dispose()


def job_broker() -> str | None:
    """The Celery broker's URL where this process sends jobs there (RSIGYM_JOBS_BACKEND=celery)."""
    return WorkerSettings().broker_url if JobSettings().backend == "celery" else None


def _down(reason: str) -> PartReport:
    return {"status": "down", "reason": reason}
