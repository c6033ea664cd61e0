"""What other packages may read of the records' store rows (the operator's dashboard and a run's
timeline): plain values, never the table classes, so the records' tables stay their own."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kit.errors import Conflict
from services.records.events import SUBMISSION, TRAINING_JOB, RecordEvent
from services.records.experiments import STATUSES, Experiment
from services.records.tables import AuditRow, IntegrityCheck, MonitorAlert

if TYPE_CHECKING:
    from access.generations import InitialSystem

MONITOR_KEY_NAME = "rsigym-monitor"
"""The gym's own root key the live monitor's judge calls are metered on (services/records/monitor.py)."""


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


def monitor_alerts(s: Session, run_id: str | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
    """The live monitor's alerts (services/records/monitor.py), newest first; one run's when given."""
    q = select(MonitorAlert)
    if run_id is not None:
        q = q.where(MonitorAlert.run_id == run_id)
    return [alert_view(r) for r in s.scalars(q.order_by(MonitorAlert.created_at.desc(), MonitorAlert.id).limit(limit))]


def monitor_alert_counts(s: Session, run_ids: set[str]) -> dict[str, int]:
    """Run → its live-monitor alerts (runs without any are absent)."""
    if not run_ids:
        return {}
    return {run_id: int(n) for run_id, n in s.execute(
        select(MonitorAlert.run_id, func.count()).where(MonitorAlert.run_id.in_(run_ids)).group_by(MonitorAlert.run_id))}


def alert_view(row: MonitorAlert) -> dict[str, Any]:
    return {"id": row.id, "run_id": row.run_id, "category": row.category, "code": row.code,
            "evidence": row.evidence, "judge_model": row.judge_model, "turns": [row.first_seq, row.last_seq],
            "paused": row.paused, "created_at": row.created_at.isoformat()}


# -- live integrity (services/records/live_integrity.py): the operator's only ------------------


def integrity_checks(s: Session, run_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """The run's live integrity checks (contamination at upload, provenance at submission), newest first."""
    from services.records.live_integrity import check_view

    return [check_view(r) for r in s.scalars(select(IntegrityCheck).where(IntegrityCheck.run_id == run_id)
                                             .order_by(IntegrityCheck.created_at.desc(), IntegrityCheck.id)
                                             .limit(limit))]


def integrity_totals(s: Session) -> dict[tuple[str, str], tuple[int, int]]:
    """(check, verdict) → (checks, hits) over every run (the gateway's /metrics)."""
    return {(kind, verdict): (int(n), int(hits or 0)) for kind, verdict, n, hits in s.execute(
        select(IntegrityCheck.kind, IntegrityCheck.verdict, func.count(), func.sum(IntegrityCheck.hits))
        .group_by(IntegrityCheck.kind, IntegrityCheck.verdict))}


def run_integrity(s: Session, run_id: str) -> dict[str, Any]:
    """The operator's live ``integrity`` of a run and of each of its experiments (``rsigym watch``,
    the dashboard): contamination hits so far, provenance at each submission, the newest audit.
    ``status`` is the newest audit's (``pending`` until one ran); ``live`` is ``flagged`` once a
    live check flagged something, ``clean`` when every one passed, ``unchecked`` before any ran."""
    checks = list(s.scalars(select(IntegrityCheck).where(IntegrityCheck.run_id == run_id)
                            .order_by(IntegrityCheck.created_at, IntegrityCheck.id)))
    scans = [c for c in checks if c.kind == "contamination"]
    hits = [c for c in scans if c.verdict == "flag"]
    hit_shas = {str((c.report or {}).get("sha256")): c.subject for c in hits}
    provenance = {c.subject: c for c in checks if c.kind == "provenance"}  # the newest per submission
    newest = s.scalars(select(AuditRow).where(AuditRow.run_id == run_id)
                       .order_by(AuditRow.created_at.desc(), AuditRow.id.desc())).first()
    trained: dict[str, set[str]] = {}  # experiment → datasets (sha256) its jobs trained on
    submitted: dict[str, list[str]] = {}  # experiment → its submissions
    for e in s.scalars(select(RecordEvent).where(RecordEvent.run_id == run_id,
                                                 RecordEvent.kind.in_((TRAINING_JOB, SUBMISSION)))
                       .order_by(RecordEvent.seq)):
        if e.experiment_id is None:
            continue
        if e.kind == TRAINING_JOB:
            trained.setdefault(e.experiment_id, set()).update(
                str(d.get("sha256")) for d in e.data.get("datasets") or [] if isinstance(d, dict))
        elif isinstance(e.data.get("submission_id"), str):
            submitted.setdefault(e.experiment_id, []).append(e.data["submission_id"])
    experiments = []
    for exp in s.scalars(select(Experiment).where(Experiment.run_id == run_id)
                         .order_by(Experiment.created_at, Experiment.id)):
        datasets_hit = sorted(hit_shas[h] for h in trained.get(exp.id, ()) if h in hit_shas)
        subs = [provenance[x] for x in submitted.get(exp.id, []) if x in provenance]
        experiments.append({"id": exp.id, "name": exp.name, "status": exp.status,
                            "contamination_hits": len(datasets_hit), "datasets_hit": datasets_hit,
                            "provenance": [{"submission_id": c.subject, "verdict": c.verdict} for c in subs]})
    flagged = bool(hits) or any(c.verdict == "flag" for c in provenance.values())
    return {
        "status": newest.status if newest is not None else "pending",
        "live": "flagged" if flagged else ("clean" if checks else "unchecked"),
        "contamination": {"scanned": len(scans), "hits": len(hits),
                          "tasks": sorted({t for c in hits for t in (c.report or {}).get("contaminated") or []}),
                          "datasets": [{"dataset_id": c.subject, "tasks": c.hits, "seconds": c.seconds,
                                        "at": c.created_at.isoformat()} for c in hits],
                          "inconclusive": sum(1 for c in scans if c.verdict == "inconclusive")},
        "provenance": [{"submission_id": c.subject, "verdict": c.verdict, "findings": c.hits,
                        "at": c.created_at.isoformat()} for c in provenance.values()],
        "audit": None if newest is None else {"id": newest.id, "status": newest.status,
                                              "hacking_rate": newest.hacking_rate,
                                              "created_at": newest.created_at.isoformat()},
        "experiments": experiments,
    }


@dataclass(frozen=True)
class AuditVerdict:
    """A run's newest audit: its verdict, the submission it judged and why it flagged (if it did)."""

    id: str
    status: str
    submission_id: str | None
    reasons: tuple[str, ...]
    """The flagged checks' names and the submission's reasons (empty for an accepted audit)."""
    created_at: datetime


def latest_audit(s: Session, run_id: str) -> AuditVerdict | None:
    """The run's newest audit (the one ``rsigym score`` ran over its final submission), or None."""
    row = s.scalars(select(AuditRow).where(AuditRow.run_id == run_id)
                    .order_by(AuditRow.created_at.desc(), AuditRow.id.desc())).first()
    if row is None:
        return None
    report = row.report or {}
    flagged = [str(c.get("name")) for c in report.get("checks") or [] if c.get("verdict") != "pass"]
    reasons = [*flagged, *(str(r) for r in report.get("submission_reasons") or [])]
    return AuditVerdict(id=row.id, status=row.status, submission_id=((report.get("submission") or {}).get("id")),
                        reasons=tuple(reasons), created_at=row.created_at)


def accepted_system(s: Session, run_id: str) -> InitialSystem:
    """``run_id``'s final, scored, audit-accepted submission as a system to build on, or a 409 that
    says what is missing (the run itself exists and has ended: access/generations.py checks).

    Two users: ``--from RUN`` (the next generation's initial system: gateway/admin.py passes this
    reader to access/generations.py, which may not read the services' stores) and the gym-served
    agent model ``gym:from:RUN`` (services/inference/agent_models.py). The audit must have judged
    the final submission itself."""
    from access.generations import InitialSystem, granted_checkpoint
    from services.evaluation import read as evaluation_read  # evaluation's read reaches no records module
    from services.training import read as training_read

    submission = evaluation_read.final_submission(s, run_id)
    if submission is None:
        raise Conflict(f"run {run_id} submitted nothing: there is no system to start from", param="from_run")
    audit = latest_audit(s, run_id)
    if audit is None or audit.submission_id != submission.id:
        raise Conflict(f"run {run_id}'s final submission {submission.id} has not been audited: audit and score it "
                       f"first (rsigym score {run_id})", param="from_run")
    if audit.status != "accepted":
        why = "; ".join(audit.reasons) or audit.status
        raise Conflict(f"run {run_id}'s audit flagged it: {why} (audit {audit.id}); a flagged system cannot be "
                       "built on", param="from_run")
    if not evaluation_read.scored_submission(s, run_id, submission.id):
        raise Conflict(f"run {run_id}'s final submission {submission.id} has not been scored: score it first "
                       f"(rsigym score {run_id})", param="from_run")
    weights_hash, base_model = None, submission.model
    if submission.checkpoint_id is not None:
        ckpt = training_read.checkpoint_facts(s, submission.checkpoint_id)
        if ckpt is None or (ckpt.run_id != run_id and not granted_checkpoint(s, run_id, ckpt.id)):
            raise Conflict(f"run {run_id}'s submitted checkpoint {submission.checkpoint_id} is no longer stored",
                           param="from_run")
        weights_hash, base_model = ckpt.weights_hash, ckpt.base_model
    return InitialSystem(submission_id=submission.id, model=submission.checkpoint_id or submission.model,
                         harness=submission.harness, weights_hash=weights_hash, base_model=base_model,
                         audit_id=audit.id)
