"""What other packages may read of the records' store rows (the operator's dashboard and a run's
timeline): plain values, never the table classes, so the records' tables stay their own."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from services.records.events import RecordEvent
from services.records.experiments import STATUSES, Experiment
from services.records.tables import AuditRow


def audit_statuses(s: Session, run_ids: set[str]) -> dict[tuple[str, str | None], str]:
    """Each submission's newest audit verdict (accepted | flagged), by (run, submission id): an
    audit vouches for the submission it judged only, as in ``rsigym report``. Submissions never
    audited are absent."""
    out: dict[tuple[str, str | None], str] = {}
    if not run_ids:
        return out
    for row in s.execute(select(AuditRow.run_id, AuditRow.status, AuditRow.report).where(AuditRow.run_id.in_(run_ids))
                         .order_by(AuditRow.created_at)):
        out[(row.run_id, ((row.report or {}).get("submission") or {}).get("id"))] = row.status
    return out


def audited_runs(s: Session, run_ids: set[str]) -> set[str]:
    """Those of ``run_ids`` audited at least once (a run's lifecycle: access/lifecycle.py)."""
    if not run_ids:
        return set()
    return set(s.scalars(select(AuditRow.run_id).where(AuditRow.run_id.in_(run_ids)).distinct()))


def key_event_times(s: Session, run_id: str) -> tuple[datetime | None, datetime | None]:
    """The earliest and latest of the run's events caused by one of its keys (None: none was);
    what the platform or the operator wrote on their own (``key_id`` None) is left out."""
    first, last = s.execute(select(func.min(RecordEvent.created_at), func.max(RecordEvent.created_at))
                            .where(RecordEvent.run_id == run_id, RecordEvent.key_id.is_not(None))).one()
    return first, last


def experiment_counts(s: Session, run_id: str) -> dict[str, int]:
    """Status → the run's experiments in it, every status listed."""
    counts = dict.fromkeys(STATUSES, 0)
    for status, n in s.execute(select(Experiment.status, func.count()).where(Experiment.run_id == run_id)
                               .group_by(Experiment.status)):
        counts[status] = counts.get(status, 0) + n
    return counts
