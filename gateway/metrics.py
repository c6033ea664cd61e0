"""Prometheus instruments of one gateway (own registry: several apps may share a process)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobs.lifecycle import merged_figures
from kit.errors import StoreUnavailable
from services.evaluation import read as evaluation
from services.records import read as records
from services.training import read as training
from storage.store import Store

log = logging.getLogger("rsigym.gateway")


def _child(metric: str, *labels: str) -> Any:
    """A :class:`ServiceInstruments` attribute: ``metric``'s child for the service (and ``labels``)."""
    return cached_property(lambda self: getattr(self._metrics, metric).labels(self._service, *labels))


class ServiceInstruments:
    """One service's children of the gateway's instruments, each looked up the first time it is
    used (a series appears once it counts something, as before): ``labels()`` takes a lock and
    builds a key on every call, and a forwarded call made seven such lookups."""

    reserved = _child("reservations", "reserved")
    released = _child("reservations", "released")
    settled = _child("reservations", "settled")
    spend = _child("spend")
    overrun = _child("overrun")
    in_flight = _child("in_flight")
    latency = _child("latency")

    def __init__(self, metrics: GatewayMetrics, service: str):
        self._metrics, self._service = metrics, service


class GatewayMetrics:
    def __init__(self) -> None:
        self._services: dict[str, ServiceInstruments] = {}
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
        self.monitor_alerts = Counter(
            "rsigym_monitor_alerts", "EXECUTED behaviours the live monitor found (each paused its run), by category; "
            "counted by the replica whose round raised it", ["category"], registry=self.registry,
        )
        self.principal_cache = Counter(
            "rsigym_principal_cache", "Key authentications answered from this replica's cache (hit) or the store (miss)",
            ["result"], registry=self.registry,
        )

    @cached_property
    def principal_cache_hit(self) -> Counter:
        """The cache's hits, counted on every authenticated call: its child looked up once."""
        return self.principal_cache.labels("hit")

    def of(self, service: str) -> ServiceInstruments:
        """``service``'s instruments."""
        found = self._services.get(service)
        if found is None:
            found = self._services.setdefault(service, ServiceInstruments(self, service))
        return found

    def track_jobs(self, store: Store) -> None:
        """Export the job queues and every service's charges, read from the store at scrape time
        (see :class:`JobQueueCollector` and :class:`LedgerChargeCollector`)."""
        self.registry.register(JobQueueCollector(store))
        self.registry.register(LedgerChargeCollector(store))
        self.registry.register(IntegrityCollector(store))

    def render(self) -> bytes:
        """Blocking when jobs are tracked (store reads): call it off the event loop."""
        return generate_latest(self.registry)


class JobQueueCollector(Collector):
    """Queue depth and oldest-job age per queue, and jobs finished by kind and status, read from
    the job tables: every replica and worker writes there, so any gateway reports the whole gym,
    and a job finished by a worker (or failed by a reaper) is counted once, where it was written."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self) -> Iterator[Metric]:
        try:
            figures = merged_figures([training.job_queues(self.store), evaluation.job_queues(self.store)])
            finished = training.finished_jobs(self.store) | evaluation.finished_jobs(self.store)
        except StoreUnavailable:
            log.warning("/metrics: job queues skipped, the store cannot be reached")
            return
        depth = GaugeMetricFamily("rsigym_queue_depth", "Jobs waiting in each queue", labels=["queue"])
        age = GaugeMetricFamily("rsigym_queue_oldest_age_seconds", "Age of the oldest waiting job in each queue",
                                labels=["queue"])
        for queue, (n, oldest) in sorted(figures.items()):
            depth.add_metric([queue], n)
            age.add_metric([queue], oldest)
        done = CounterMetricFamily("rsigym_jobs_finished", "Jobs that reached a final state", labels=["kind", "status"])
        for (kind, status), n in sorted(finished.items()):
            done.add_metric([kind, status], n)
        yield from (depth, age, done)


class LedgerChargeCollector(Collector):
    """USD charged to runs, summed from the ledger at scrape time: by service
    (``rsigym_ledger_charged_usd``), by model and service (``rsigym_model_spend_usd``) and by key and
    model (``rsigym_key_spend_usd``, LiteLLM's ``litellm_spend_metric`` per key and model).
    ``rsigym_spend_usd`` counts what this replica settled for the calls it forwarded; training
    steps, sandbox slices and evaluation work are settled by the services and workers themselves,
    so only the ledger — which they all write — has every service's spend, once, whichever replica
    is scraped. The per-key and per-model series are bounded (billing/spend.py)."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self) -> Iterator[Metric]:
        from sqlalchemy import func, select

        from billing import spend
        from billing.money import nusd_to_usd
        from storage.tables import LedgerEntry

        try:
            with self.store.transaction() as s:
                rows = s.execute(select(LedgerEntry.service, func.sum(LedgerEntry.actual_nusd))
                                 .where(LedgerEntry.actual_nusd.is_not(None)).group_by(LedgerEntry.service)).all()
            charged_rows = spend.charged(self.store)
            keys = spend.with_names(self.store, spend.by_key(charged_rows))
        except StoreUnavailable:
            log.warning("/metrics: ledger charges skipped, the store cannot be reached")
            return
        charged = CounterMetricFamily("rsigym_ledger_charged_usd",
                                      "USD charged to runs, by service, from the ledger (every service and worker)",
                                      labels=["service"])
        for service, nusd in sorted(rows):
            charged.add_metric([service], nusd_to_usd(int(nusd or 0)))
        by_model = CounterMetricFamily("rsigym_model_spend_usd",
                                       "USD charged to runs, by the model the work named and service, from the ledger",
                                       labels=["model", "service"])
        for item in spend.by_model(charged_rows):
            by_model.add_metric([item["model"], item["service"]], item["charged_usd"])
        by_key = CounterMetricFamily("rsigym_key_spend_usd",
                                     "USD charged, by key (id, never the secret) and model, from the ledger",
                                     labels=["key_id", "key_name", "run_id", "model"])
        for item in keys:
            by_key.add_metric([item["key_id"], item["key_name"], item["run_id"], item["model"]], item["charged_usd"])
        yield from (charged, by_model, by_key)


class IntegrityCollector(Collector):
    """The live integrity checks (services/records/live_integrity.py), counted from the store at
    scrape time (the training and evaluation services write them, wherever they run):
    ``rsigym_contamination_hits_total`` (datasets a scan at upload found contaminated — the
    ``ContaminatedUpload`` alert), ``rsigym_provenance_flags_total`` (submissions whose provenance
    failed) and ``rsigym_integrity_checks_total{check, verdict}``."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self) -> Iterator[Metric]:
        try:
            with self.store.transaction() as s:
                totals = records.integrity_totals(s)
        except StoreUnavailable:
            log.warning("/metrics: integrity checks skipped, the store cannot be reached")
            return
        checks = CounterMetricFamily("rsigym_integrity_checks", "Live integrity checks, by check and verdict",
                                     labels=["check", "verdict"])
        for (kind, verdict), (n, _) in sorted(totals.items()):
            checks.add_metric([kind, verdict], n)
        hits = CounterMetricFamily("rsigym_contamination_hits",
                                   "Uploaded datasets a live scan found contaminated (the operator's only)")
        hits.add_metric([], totals.get(("contamination", "flag"), (0, 0))[0])
        provenance = CounterMetricFamily("rsigym_provenance_flags", "Submissions whose provenance check failed")
        provenance.add_metric([], totals.get(("provenance", "flag"), (0, 0))[0])
        yield from (checks, hits, provenance)
