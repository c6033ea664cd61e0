"""What the dashboard pages show, read from the store: the platform's keys and ledger directly, the
services' rows through their read modules.

Each function takes the :class:`Store` and returns plain data (dicts, lists, numbers) for one
page; routes run them off the event loop with ``store.call``. Money is converted from nano-USD
here, once. Nothing in this module writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from access.keys import state_of
from access.lifecycle import time_left
from billing.money import nusd_to_usd
from jobs.lifecycle import merged_figures
from kit.errors import NotFound
from ops.dashboard.lineage import platform_lineage
from services.evaluation import read as evaluation
from services.evaluation.submission_rule import SUBMISSION_RULE
from services.evaluation.submissions import final_submission
from services.records import read as records
from services.training import read as training
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry, utcnow

AUDIT_STATUS = "not audited"
"""What a run shows until `rsigym audit RUN` (services/records/audits) has judged it."""
VERIFIER_TAIL = 4000
FAILED_ROWS = 20
RECENT_ROWS = 20


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else ""


METER_PREFIX = "agent-model:"
"""A run's agent-model meter is a root key named so (billing/agent_meter.py)."""


def _time_left_s(row: ApiKey, ended: bool, now: datetime) -> float | None:
    """Seconds until the run's deadline (access/lifecycle.py: a paused run's clock stands still);
    None without a deadline or once the run has ended."""
    return None if ended else time_left(row.ends_at, row.paused_at, now)


def _run_view(row: ApiKey, *, audited: bool = False, scored: bool = False,
              now: datetime | None = None) -> dict[str, Any]:
    budget = row.budget_nusd
    remaining = None if budget is None else budget - row.spent_nusd - row.reserved_nusd
    state = state_of(row, audited=audited, scored=scored)
    return {
        "id": row.id, "name": row.name or "", "track": row.track or "-", "status": row.status,
        "task": row.task or "", "agent": row.agent or "", "agent_version": row.agent_version or "",
        "agent_model": row.agent_model or "", "agent_exit": row.agent_exit,
        "state": str(state), "state_name": state.state, "ended": state.ended,
        "time_left_s": _time_left_s(row, state.ended, now or utcnow()),
        "ends_at": _iso(row.ends_at), "agent_meter_id": row.agent_meter_id,
        "budget_usd": None if budget is None else nusd_to_usd(budget),
        "spent_usd": nusd_to_usd(row.spent_nusd), "reserved_usd": nusd_to_usd(row.reserved_nusd),
        "remaining_usd": None if remaining is None else nusd_to_usd(remaining),
        "created_at": _iso(row.created_at),
    }


def _meter_view(row: ApiKey | None) -> dict[str, Any] | None:
    if row is None:
        return None
    budget = row.budget_nusd or 0
    return {"id": row.id, "status": row.status, "budget_usd": nusd_to_usd(budget),
            "spent_usd": nusd_to_usd(row.spent_nusd), "reserved_usd": nusd_to_usd(row.reserved_nusd),
            "remaining_usd": nusd_to_usd(budget - row.spent_nusd - row.reserved_nusd)}


def platform_kind(row: ApiKey, meter_ids: set[str]) -> str | None:
    """What a root key is when it is not a run: the gym's ``operator`` key or an ``agent-model meter``."""
    if row.id in meter_ids or (row.name or "").startswith(METER_PREFIX):
        return "agent-model meter"
    if row.name == evaluation.OPERATOR_KEY_NAME and row.track is None:
        return "operator"
    if row.name == records.MONITOR_KEY_NAME and row.track is None:
        return "monitor"
    return None


def _runs_and_platform(s: Session) -> tuple[list[ApiKey], list[tuple[ApiKey, str]]]:
    """Root keys split into runs and platform keys (the operator key, agent-model meters)."""
    roots = s.scalars(select(ApiKey).where(ApiKey.parent_id.is_(None)).order_by(ApiKey.created_at)).all()
    meter_ids = {r.agent_meter_id for r in roots if r.agent_meter_id}
    runs, platform = [], []
    for row in roots:
        kind = platform_kind(row, meter_ids)
        if kind is None:
            runs.append(row)
        else:
            platform.append((row, kind))
    return runs, platform


def _latest_scores(s: Session, run_ids: set[str]) -> dict[str, dict[str, Any]]:
    """Each run's newest score row (with its job's live status and score), in a fixed number of
    queries whatever the number of runs."""
    latest: dict[str, evaluation.ScoreView] = {}
    for row in evaluation.scores(s, newest_first=True):
        if row.run_id in run_ids and row.run_id not in latest:
            latest[row.run_id] = row
    return {v["run_id"]: v for v in _score_views(s, list(latest.values()))}


def _run_audit(audits: dict[tuple[str, str | None], str], run_id: str, score: dict[str, Any] | None) -> str:
    """The audit verdict the runs table shows: the latest scored submission's, else the worst of
    the run's verdicts (``flagged`` over ``accepted``), else not audited."""
    if score is not None and (run_id, score["submission_id"] or None) in audits:
        return audits[(run_id, score["submission_id"] or None)]
    verdicts = {status for (run, _), status in audits.items() if run == run_id}
    if not verdicts:
        return AUDIT_STATUS
    return "flagged" if "flagged" in verdicts else sorted(verdicts)[0]


# -- overview ----------------------------------------------------------------------------------


def overview(store: Store) -> dict[str, Any]:
    """The runs (root keys that are not platform keys; a root's figures already include its child
    keys) with their lifecycle state, both meters' spend, latest score and audit; the platform's
    own keys apart; and totals over the runs. A fixed number of queries, however many runs."""
    now = utcnow()
    with store.transaction() as s:
        rows, platform = _runs_and_platform(s)
        ids = {r.id for r in rows}
        audits = records.audit_statuses(s, ids)
        alerts = records.monitor_alert_counts(s, ids)
        scored = evaluation.scored_runs(s, ids)
        latest = _latest_scores(s, ids)
        meters = {m.id: m for m, kind in platform if kind == "agent-model meter"}
        runs = []
        for r in rows:
            view = _run_view(r, audited=any(run == r.id for run, _ in audits), scored=r.id in scored, now=now)
            score = latest.get(r.id)
            view |= {"meter": _meter_view(meters.get(r.agent_meter_id or "")), "score": score,
                     "audit": _run_audit(audits, r.id, score), "alerts": alerts.get(r.id, 0)}
            runs.append(view)
    budgets = [r.budget_nusd or 0 for r in rows]
    metered = [v["meter"] for v in runs if v["meter"] is not None]
    totals = {
        "runs": len(runs),
        "active": sum(1 for v in runs if not v["ended"]),
        "budget_usd": nusd_to_usd(sum(budgets)),
        "spent_usd": nusd_to_usd(sum(r.spent_nusd for r in rows)),
        "reserved_usd": nusd_to_usd(sum(r.reserved_nusd for r in rows)),
        "remaining_usd": nusd_to_usd(sum(b - r.spent_nusd - r.reserved_nusd for b, r in zip(budgets, rows, strict=True))),
        "agent_spent_usd": sum(m["spent_usd"] for m in metered),
        "alerts": sum(alerts.values()),
    }
    return {"runs": runs, "totals": totals,
            "platform": [{**_run_view(k, now=now), "kind": kind, "run_of": (k.name or "")[len(METER_PREFIX):]
                          if kind == "agent-model meter" else ""} for k, kind in platform]}


# -- run detail --------------------------------------------------------------------------------


def _ledger_view(r: LedgerEntry) -> dict[str, Any]:
    return {
        "id": r.id, "key_id": r.key_id, "service": r.service, "operation": r.operation, "ref_id": r.ref_id or "",
        "status": r.status, "estimate_usd": nusd_to_usd(r.estimate_nusd),
        "actual_usd": None if r.actual_nusd is None else nusd_to_usd(r.actual_nusd),
        "created_at": _iso(r.created_at), "settled_at": _iso(r.settled_at),
    }


def spend_series(rows: Sequence[tuple[datetime | None, datetime, int | None]]) -> list[tuple[datetime, float]]:
    """Cumulative charged USD over time from (settled_at, created_at, actual_nusd) rows: one point
    per charged ledger row, at its settlement."""
    charged = sorted(((settled or created, nusd) for settled, created, nusd in rows if nusd), key=lambda p: p[0])
    total, points = 0, []
    for at, nusd in charged:
        total += nusd
        points.append((at, nusd_to_usd(total)))
    return points


def _lease(job: training.JobView | evaluation.JobView, now: datetime) -> dict[str, Any]:
    """Who holds a job and how it fares: its worker (host:pid:nonce), its heartbeat's age, and how
    often a lost worker's job was put back in the queue (``resumes``: a job is taken once per
    ``claims``, so a queued job was resumed ``claims`` times, any other ``claims - 1``)."""
    heartbeat = job.heartbeat_at
    return {"worker": job.worker or "",
            "heartbeat_age_s": None if heartbeat is None else max(0.0, (now - heartbeat).total_seconds()),
            "resumes": job.claims if job.status == "queued" else max(0, job.claims - 1)}


def training_job_view(job: training.JobView, now: datetime | None = None) -> dict[str, Any]:
    return {**_lease(job, now or utcnow()),
        "id": job.id, "run_id": job.run_id, "status": job.status, "queue": job.queue, "base_model": job.base_model,
        "parent": job.parent_checkpoint_id or "", "step": job.step, "total_steps": job.total_steps,
        "percent": _percent(job.step, job.total_steps), "cost_usd": nusd_to_usd(job.cost_nusd),
        "error": job.error or "", "created_at": _iso(job.created_at), "finished_at": _iso(job.finished_at),
    }


def evaluation_job_view(job: evaluation.JobView, now: datetime | None = None) -> dict[str, Any]:
    return {**_lease(job, now or utcnow()),
        "id": job.id, "run_id": job.run_id, "purpose": job.purpose, "status": job.status, "queue": job.queue,
        "benchmark": job.benchmark, "split": job.split, "model": job.model, "harness": job.harness,
        "attempts": job.attempts, "done": job.trials_done, "total": job.trials_total,
        "percent": _percent(job.trials_done, job.trials_total), "score": job.score, "error": job.error or "",
        "created_at": _iso(job.created_at), "finished_at": _iso(job.finished_at),
    }


def _percent(done: int, total: int) -> int:
    return 0 if total <= 0 else max(0, min(100, round(100 * done / total)))


def _score_views(s: Session, rows: Sequence[evaluation.ScoreView]) -> list[dict[str, Any]]:
    """Score rows with their job's live status and score (as the evaluation service reports them)."""
    audits = records.audit_statuses(s, {r.run_id for r in rows})
    jobs = evaluation.jobs_by_id(s, [r.job_id for r in rows])
    views = []
    for r in rows:
        job = jobs.get(r.job_id)
        status = job.status if job else r.status
        score = job.score if job is not None and job.status == "succeeded" else r.score
        views.append({
            "id": r.id, "run_id": r.run_id, "agent": r.agent, "submission_id": r.submission_id or "",
            "benchmark": r.benchmark, "split": r.split, "model": r.model, "harness": r.harness,
            "attempts": r.attempts, "job_id": r.job_id, "score": score, "status": status,
            "subset": r.subset, "subset_seed": r.subset_seed, "split_seed": r.split_seed,
            "done": job.trials_done if job else None, "total": job.trials_total if job else None,
            "audit": audits.get((r.run_id, r.submission_id), AUDIT_STATUS),
            "created_at": r.created_at.isoformat() if r.created_at else None,
        })
    return views


def run_key(s: Session, run_id: str) -> ApiKey:
    """The run key ``run_id``: a root key that is not a platform key, or NotFound (child keys, the
    operator key and agent-model meters are not runs)."""
    key = s.get(ApiKey, run_id)
    if key is None or key.parent_id is not None or platform_kind(key, set(s.scalars(
            select(ApiKey.agent_meter_id).where(ApiKey.agent_meter_id == run_id)))) is not None:
        raise NotFound(f"run {run_id} not found", param="run")
    return key


ACTIONS = ("topup", "pause", "resume", "stop", "revoke")


def actions_for(key: ApiKey, *, audited: bool = False, scored: bool = False) -> list[str]:
    """The operator's actions that apply to the run now: none once it has ended; resume only when
    paused, pause only when it is not."""
    state = state_of(key, audited=audited, scored=scored)
    if state.ended or key.status == "revoked":
        return []
    return ["topup", "resume" if key.status == "paused" else "pause", "stop", "revoke"]


def run_detail(store: Store, run_id: str, limit: int) -> dict[str, Any]:
    with store.transaction() as s:
        key = run_key(s, run_id)
        meter = s.get(ApiKey, key.agent_meter_id) if key.agent_meter_id else None
        audits = records.audit_statuses(s, {run_id})
        scored = bool(evaluation.scored_runs(s, {run_id}))
        children = s.scalar(select(func.count()).select_from(ApiKey).where(
            ApiKey.root_id == run_id, ApiKey.id != run_id)) or 0
        charged = s.execute(select(LedgerEntry.settled_at, LedgerEntry.created_at, LedgerEntry.actual_nusd)
                            .where(LedgerEntry.run_id == run_id, LedgerEntry.actual_nusd > 0)).tuples().all()
        ledger_total = s.scalar(select(func.count()).select_from(LedgerEntry).where(LedgerEntry.run_id == run_id))
        ledger = s.scalars(select(LedgerEntry).where(LedgerEntry.run_id == run_id)
                           .order_by(LedgerEntry.created_at.desc()).limit(limit)).all()
        training_jobs = training.jobs(s, run_id=run_id, newest_first=True, limit=limit)
        evaluations = evaluation.jobs(s, run_id=run_id, newest_first=True, limit=limit)
        score_rows = evaluation.scores(s, run_id=run_id, newest_first=True, limit=limit)
        graph = platform_lineage(s, run_id)
        final = final_submission(s, run_id)
        return {
            "submission_rule": SUBMISSION_RULE, "final_submission": final.id if final else None,
            "run": _run_view(key, audited=bool(audits), scored=scored), "child_keys": children,
            "meter": _meter_view(meter), "actions": actions_for(key, audited=bool(audits), scored=scored),
            "spend": spend_series(charged),
            "ledger": [_ledger_view(r) for r in ledger], "ledger_total": ledger_total or 0,
            "training": [training_job_view(j) for j in training_jobs],
            "evaluations": [evaluation_job_view(j) for j in evaluations],
            "scores": _score_views(s, score_rows),
            "graph": graph,
            "alerts": records.monitor_alerts(s, run_id, limit=limit),
            "integrity": records.run_integrity(s, run_id),
            "integrity_flags": [c for c in records.integrity_checks(s, run_id, limit=limit) if c["verdict"] == "flag"],
        }


# -- jobs and queues -----------------------------------------------------------------------------


def _queues(store: Store) -> list[dict[str, Any]]:
    """Depth, age of the oldest waiting job, and running jobs per queue — from the job tables,
    the same figures the gateway's queue metrics export (the broker's view may lag the table)."""
    waiting = merged_figures([training.job_queues(store), evaluation.job_queues(store)])
    running: dict[str, int] = {}
    with store.transaction() as s:
        for counts in (training.running_by_queue(s), evaluation.running_by_queue(s)):
            for queue, n in counts.items():
                running[queue] = running.get(queue, 0) + n
    return [{"name": q, "queued": depth, "oldest_age_s": age if depth else None, "running": running.get(q, 0)}
            for q, (depth, age) in sorted({**{q: (0, 0.0) for q in running}, **waiting}.items())]


def jobs(store: Store, limit: int, heartbeat_ttl_s: float) -> dict[str, Any]:
    """Queues; in-flight jobs with their worker and heartbeat (``stale``: older than the TTL the
    reaper acts on, jobs/lifecycle.py); recently failed jobs of both kinds; recently finished
    evaluations; and how many jobs listed were resumed after their worker was lost."""
    queues = _queues(store)
    now = utcnow()
    with store.transaction() as s:
        running = ([{**training_job_view(j, now), "kind": "training"} for j in training.jobs(s, in_flight=True, limit=limit)]
                   + [{**evaluation_job_view(j, now), "kind": "evaluation"}
                      for j in evaluation.jobs(s, in_flight=True, limit=limit)])
        ended_training = [training_job_view(j, now) for j in training.jobs(s, in_flight=False, newest_first=True, limit=limit)]
        ended_evals = [evaluation_job_view(j, now) for j in evaluation.jobs(s, in_flight=False, newest_first=True, limit=limit)]
    for job in running:
        age = job["heartbeat_age_s"]
        job["stale"] = job["status"] == "running" and (age is None or age > heartbeat_ttl_s)
    failed = sorted([{**j, "kind": "training"} for j in ended_training if j["status"] == "failed"]
                    + [{**j, "kind": "evaluation"} for j in ended_evals if j["status"] == "failed"],
                    key=lambda j: j["finished_at"] or j["created_at"], reverse=True)[:FAILED_ROWS]
    return {
        "queues": queues,
        "training": [j for j in running if j["kind"] == "training"],
        "evaluations": [j for j in running if j["kind"] == "evaluation"],
        "failed": failed,
        "resumed": sum(1 for j in running + ended_training + ended_evals if j["resumes"]),
        "recent_evaluations": ended_evals[:RECENT_ROWS],
    }


# -- submissions, scores, leaderboard ------------------------------------------------------------


def scores(store: Store, limit: int) -> dict[str, Any]:
    with store.transaction() as s:
        rows = evaluation.scores(s, newest_first=True, limit=limit)
        subs = evaluation.submissions(s, newest_first=True, limit=limit)
        audits = records.audit_statuses(s, {r.run_id for r in subs})
        return {
            "scores": _score_views(s, rows),
            "submissions": [{"id": r.id, "run_id": r.run_id, "track": r.track or "-", "model": r.model,
                             "checkpoint": r.checkpoint_id or "", "harness": r.harness,
                             "created_at": _iso(r.created_at), "audit": audits.get((r.run_id, r.id), AUDIT_STATUS)} for r in subs],
        }


def leaderboard(store: Store, split: str) -> dict[str, Any]:
    """The RSI-Index per run and per agent, computed exactly as ``rsigym report`` does, each run's
    index and terms with their 95% bootstrap interval over the scoring jobs' trials."""
    from services.evaluation.bootstrap import task_rewards
    from services.evaluation.report import FORMULA, build_report, build_report_rows, group_rows, report_jobs

    with store.transaction() as s:
        score_views = _score_views(s, evaluation.scores(s))
        keys = [{"id": k.id, "name": k.name, "track": k.track, "agent": k.agent, "agent_version": k.agent_version}
                for k in s.scalars(select(ApiKey).where(ApiKey.parent_id.is_(None))).all()]
        rows, notes = build_report_rows(score_views, keys, split)
        trials = {job: task_rewards(evaluation.trial_rewards(s, [job])) for job in report_jobs(rows)}
    report = build_report(group_rows(rows), trials=trials)
    runs = sorted(report.runs, key=lambda r: (r.index is None, -(r.index or 0.0)))
    return {
        "formula": FORMULA, "split": split, "notes": notes, "benchmarks": list(report.benchmarks),
        "runs": [{"run_id": r.run_id, "agent": r.agent, "track": r.track, "index": r.index,
                  "ci95": r.interval.ci95 if r.interval else None,
                  "within_noise": r.interval.within_noise if r.interval else None,
                  "used": len(r.result.included), "of": len(r.result.terms),
                  "terms": [{"benchmark": t.benchmark, "initial": t.initial, "submitted": t.submitted,
                             "term": t.term, "reason": t.reason or "",
                             "ci95": r.interval.terms.get(t.benchmark) if r.interval else None}
                            for t in r.result.terms]}
                 for r in runs],
        "agents": [{"agent": a.agent, "tracks": ", ".join(a.tracks), "runs": len(a.run_ids), "index": a.index}
                   for a in sorted(report.agents, key=lambda a: (a.index is None, -(a.index or 0.0)))],
    }


# -- evaluation jobs, trials, trajectories --------------------------------------------------------


def evaluation_job(store: Store, job_id: str) -> dict[str, Any]:
    with store.transaction() as s:
        job = evaluation.job(s, job_id)
        if job is None:
            raise NotFound(f"evaluation job {job_id} not found", param="job")
        trials = evaluation.job_trials(s, job_id)
        return {"job": evaluation_job_view(job),
                "trials": [{"id": t.id, "task_id": t.task_id, "attempt": t.attempt, "reward": t.reward,
                            "error": t.error or "", "failure_kind": t.failure_kind or "",
                            "finished_at": t.finished_at or ""} for t in trials]}


def trial(store: Store, job_id: str, trial_id: int) -> dict[str, Any]:
    with store.transaction() as s:
        row = evaluation.trial(s, trial_id)
        if row is None or row.job_id != job_id:
            raise NotFound(f"trial {trial_id} of job {job_id} not found", param="trial")
        job = evaluation.job(s, job_id)
        return {
            "job": evaluation_job_view(job) if job else {"id": job_id},
            "trial": {"id": row.id, "task_id": row.task_id, "attempt": row.attempt, "reward": row.reward,
                      "error": row.error or "", "started_at": row.started_at or "", "finished_at": row.finished_at or "",
                      "sandbox_id": row.sandbox_id or "", "failure_kind": row.failure_kind or ""},
            "steps": trajectory_steps(row.trajectory),
            "trajectory_meta": _trajectory_meta(row.trajectory),
            "raw_trajectory": None if row.trajectory is None else json.dumps(row.trajectory, indent=2, ensure_ascii=False),
            "verifier_tail": (row.verifier_output or "")[-VERIFIER_TAIL:],
            "verifier_truncated": len(row.verifier_output or "") > VERIFIER_TAIL,
            "agent_tail": (row.agent_output or "")[-VERIFIER_TAIL:],
        }


def _text(value: Any) -> str:
    """Any JSON value as display text (strings as they are; the template escapes everything)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in value):
        return "\n".join(p["text"] for p in value)  # content parts
    return json.dumps(value, indent=2, ensure_ascii=False)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


KNOWN_STEP_KEYS = {"step_id", "timestamp", "source", "message", "reasoning_content", "tool_calls", "observation",
                   "metrics", "model_name"}


def trajectory_steps(trajectory: Any) -> list[dict[str, Any]]:
    """An ATIF trajectory's steps as display records: who spoke, what, which tools were called
    with what, what came back. The trajectory is written by the agent under test: every field is
    treated as untrusted text (shape checked here, escaped by the template)."""
    if not isinstance(trajectory, dict) or not isinstance(trajectory.get("steps"), list):
        return []
    steps = []
    for i, step in enumerate(trajectory["steps"], start=1):
        if not isinstance(step, dict):
            steps.append({"n": i, "source": "?", "message": _text(step), "reasoning": "", "calls": [],
                          "results": [], "metrics": "", "timestamp": "", "extra": ""})
            continue
        calls = _list(step.get("tool_calls"))
        results = _list(_dict(step.get("observation")).get("results"))
        extra = {k: v for k, v in step.items() if k not in KNOWN_STEP_KEYS}
        steps.append({
            "n": step.get("step_id", i), "source": _text(step.get("source")) or "?",
            "timestamp": _text(step.get("timestamp")), "message": _text(step.get("message")),
            "reasoning": _text(step.get("reasoning_content")),
            "calls": [{"id": _text(c.get("tool_call_id")), "name": _text(c.get("function_name")),
                       "arguments": _text(c.get("arguments"))} if isinstance(c, dict) else
                      {"id": "", "name": "?", "arguments": _text(c)} for c in calls],
            "results": [{"call": _text(r.get("source_call_id")), "content": _text(r.get("content"))}
                        if isinstance(r, dict) else {"call": "", "content": _text(r)} for r in results],
            "metrics": _text(step.get("metrics")) if step.get("metrics") else "",
            "extra": _text(extra) if extra else "",
        })
    return steps


def _trajectory_meta(trajectory: Any) -> dict[str, str]:
    if not isinstance(trajectory, dict):
        return {}
    agent, extra = _dict(trajectory.get("agent")), _dict(trajectory.get("extra"))
    meta = {"schema": trajectory.get("schema_version"), "agent": agent.get("name"), "model": agent.get("model_name"),
            "stop reason": extra.get("stop_reason"), "answer": extra.get("answer"), "error": extra.get("error"),
            "final metrics": trajectory.get("final_metrics")}
    return {k: _text(v) for k, v in meta.items() if v not in (None, "", {})}

