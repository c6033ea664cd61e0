"""Prometheus instruments of one gateway (own registry: several apps may share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "rsigym_requests", "Requests through the gateway", ["service", "operation", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "rsigym_request_seconds",
            "Time to response headers, gateway included",
            ["service"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.spend = Counter("rsigym_spend_usd", "USD settled", ["service"], registry=self.registry)
        self.overrun = Counter(
            "rsigym_provider_overrun_usd",
            "USD a settled call really cost beyond its reservation (not charged to the run; recorded on the ledger row)",
            ["service"],
            registry=self.registry,
        )
        self.reservations = Counter(
            "rsigym_reservations", "Reservation outcomes", ["service", "outcome"], registry=self.registry
        )
        self.refusals = Counter("rsigym_refusals", "Refused calls by reason", ["reason"], registry=self.registry)
        self.in_flight = Gauge("rsigym_in_flight", "Calls in flight", ["service"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
