"""Everything one gateway instance holds, handed to routes through ``app.state.gw``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from fastapi import Request

from access.keys import KeyRegistry
from billing.concurrency import ConcurrencySlots
from billing.ledger import Ledger
from gateway.metrics import GatewayMetrics
from gateway.principals import PrincipalCache, PrincipalFanout
from gateway.service_link import ServiceLink
from kit.config import GymConfig
from kit.settings import PrincipalCacheSettings
from kit.spec import ServiceContext, ServiceSpec
from services.records.write import RunRecords
from storage.store import Store

BODY_WORKERS = 4
"""Request bodies parsed and checked against policy at once, off the event loop."""


@dataclass
class Gateway:
    context: ServiceContext
    admin_token: str
    specs: dict[str, ServiceSpec]
    links: dict[str, ServiceLink]
    """How each service is reached (gateway/service_link.py): the proxied calls' direct send, and
    an httpx client for the operator's calls (audits, scoring, run ends)."""
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    closers: list[Callable[[], None]] = field(default_factory=list)
    """Embedded mode: what stops the in-process services (e.g. kills live sandboxes)."""

    @property
    def store(self) -> Store:
        return self.context.store

    @property
    def config(self) -> GymConfig:
        return self.context.config

    @property
    def internal_secret(self) -> str:
        return self.context.internal_secret

    def __post_init__(self) -> None:
        self.registry = KeyRegistry(self.store)
        self.ledger = Ledger(self.store, self.config.ledger)
        self.records = RunRecords(self.store, self.internal_secret)
        self.slots = ConcurrencySlots(self.store, lease_ttl_s=self.config.ledger.reservation_ttl_s)
        self.metrics.track_jobs(self.store)  # queue depth / age and finished jobs, read at scrape time
        self.principals = PrincipalCache(PrincipalCacheSettings())
        self.fanout = PrincipalFanout(self.principals, self.store.key_events, dialect=self.store.dialect)
        self.body_work = anyio.CapacityLimiter(BODY_WORKERS)
        """Threads that parse and apply policy to request bodies (gateway/proxy.py), apart from the
        store's and the services' threads."""

    async def aclose(self) -> None:
        for link in self.links.values():
            await link.aclose()
        for close in self.closers:
            await anyio.to_thread.run_sync(close)
        self.closers.clear()


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gw
