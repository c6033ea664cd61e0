"""A run's timeline, read straight from the store: when it started, how long until its first
training job, how many hours it was active, its experiments, and its spend by service over time.

``run_timeline`` returns plain JSON-ready data for ``GET /admin/v1/runs/{run_id}/timeline``;
``rsigym report`` draws the spend series as ``timeline-<run>.png``. Nothing here writes.

*Research hours* span the run's first to last recorded activity — ledger rows (reserved or
settled), training jobs (created or finished) and platform events caused by one of the run's
keys. Events the platform or the operator wrote on their own (audit results, operator scoring:
``key_id`` is None) are not the agent's research, so they do not stretch the span.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing.money import nusd_to_usd
from kit.errors import NotFound
from services.records import read as records
from services.training import read as training
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry

CHARGED = ("settled", "expired")
"""Closed ledger rows that may carry a charge (an expired hold can be charged its estimate)."""


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _hours(since: datetime, at: datetime) -> float:
    return (at - since).total_seconds() / 3600.0


def _activity_bounds(s: Session, run_id: str, jobs: training.JobTimes) -> tuple[datetime | None, datetime | None]:
    """Earliest and latest recorded activity of the run (see the module docstring)."""
    ledger = s.execute(select(func.min(LedgerEntry.created_at), func.max(LedgerEntry.created_at),
                              func.max(LedgerEntry.settled_at)).where(LedgerEntry.run_id == run_id)).one()
    stamps: list[tuple[datetime | None, ...]] = [
        tuple(ledger), (jobs.first_created, jobs.last_created, jobs.last_finished), records.key_event_times(s, run_id)]
    firsts = [row[0] for row in stamps if row[0] is not None]
    lasts = [t for row in stamps for t in row[1:] if t is not None]
    return (min(firsts) if firsts else None), (max(lasts) if lasts else None)


def _experiment_counts(s: Session, run_id: str) -> dict[str, int]:
    counts = records.experiment_counts(s, run_id)
    return {"total": sum(counts.values()), **counts}


def _spend_by_service(s: Session, run_id: str, started: datetime) -> tuple[dict[str, Any], int]:
    """Cumulative charged USD per service at each charge, in charge order; and the total in nano-USD."""
    rows = s.execute(
        select(LedgerEntry.service, LedgerEntry.settled_at, LedgerEntry.created_at, LedgerEntry.actual_nusd)
        .where(LedgerEntry.run_id == run_id, LedgerEntry.status.in_(CHARGED), LedgerEntry.actual_nusd > 0)
    ).tuples().all()
    charged = sorted(((settled or created, service, nusd or 0) for service, settled, created, nusd in rows),
                     key=lambda row: (row[0], row[1]))
    running: dict[str, int] = {}
    series: dict[str, list[dict[str, Any]]] = {}
    for at, service, nusd in charged:
        running[service] = running.get(service, 0) + nusd
        series.setdefault(service, []).append(
            {"at": at.isoformat(), "hours": _hours(started, at), "usd": nusd_to_usd(running[service])})
    by_service = {service: {"total_usd": nusd_to_usd(running[service]), "points": series[service]}
                  for service in sorted(series)}
    return by_service, sum(running.values())


def run_timeline(store: Store, run_id: str) -> dict[str, Any]:
    """The timeline of one run (a root key); 404 for a child key or an unknown id."""
    with store.transaction() as s:
        key = s.get(ApiKey, run_id)
        if key is None or key.parent_id is not None:
            raise NotFound(f"run {run_id} not found", param="run_id")
        started = key.created_at
        jobs = training.job_times(s, run_id)
        first_job = jobs.first_created
        first, last = _activity_bounds(s, run_id, jobs)
        experiments = _experiment_counts(s, run_id)
        by_service, total_nusd = _spend_by_service(s, run_id, started)
    return {
        "object": "run.timeline",
        "run_id": run_id,
        "started_at": started.isoformat(),
        "first_training_job_at": _iso(first_job),
        "time_to_first_training_job_s": None if first_job is None else (first_job - started).total_seconds(),
        "first_activity_at": _iso(first),
        "last_activity_at": _iso(last),
        "research_hours": 0.0 if first is None or last is None else _hours(first, last),
        "experiments": experiments,
        "spend_usd": nusd_to_usd(total_nusd),
        "spend_by_service": by_service,
    }
