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
from storage.tables import ApiKey, LedgerEntry

AUDIT_STATUS = "not audited"
"""What a run shows until `rsigym audit RUN` (services/records/audits) has judged it."""
VERIFIER_TAIL = 4000


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else ""


def _run_view(row: ApiKey) -> dict[str, Any]:
    budget = row.budget_nusd
    remaining = None if budget is None else budget - row.spent_nusd - row.reserved_nusd
    return {
        "id": row.id, "name": row.name or "", "track": row.track or "-", "status": row.status,
        "budget_usd": None if budget is None else nusd_to_usd(budget),
        "spent_usd": nusd_to_usd(row.spent_nusd), "reserved_usd": nusd_to_usd(row.reserved_nusd),
        "remaining_usd": None if remaining is None else nusd_to_usd(remaining),
        "created_at": _iso(row.created_at),
    }


# -- overview ----------------------------------------------------------------------------------


def overview(store: Store) -> dict[str, Any]:
    """Every run (a root key; a root's figures already include its child keys) and totals."""
    with store.transaction() as s:
        rows = s.scalars(select(ApiKey).where(ApiKey.parent_id.is_(None)).order_by(ApiKey.created_at)).all()
        runs = [_run_view(r) for r in rows]
    budgets = [r.budget_nusd or 0 for r in rows]
    totals = {
        "runs": len(runs),
        "active": sum(1 for r in rows if r.status == "active"),
        "budget_usd": nusd_to_usd(sum(budgets)),
        "spent_usd": nusd_to_usd(sum(r.spent_nusd for r in rows)),
        "reserved_usd": nusd_to_usd(sum(r.reserved_nusd for r in rows)),
        "remaining_usd": nusd_to_usd(sum(b - r.spent_nusd - r.reserved_nusd for b, r in zip(budgets, rows, strict=True))),
    }
    return {"runs": runs, "totals": totals}


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


def training_job_view(job: training.JobView) -> dict[str, Any]:
    return {
        "id": job.id, "run_id": job.run_id, "status": job.status, "queue": job.queue, "base_model": job.base_model,
        "parent": job.parent_checkpoint_id or "", "step": job.step, "total_steps": job.total_steps,
        "percent": _percent(job.step, job.total_steps), "cost_usd": nusd_to_usd(job.cost_nusd),
        "error": job.error or "", "created_at": _iso(job.created_at), "finished_at": _iso(job.finished_at),
    }


def evaluation_job_view(job: evaluation.JobView) -> dict[str, Any]:
    return {
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


def run_detail(store: Store, run_id: str, limit: int) -> dict[str, Any]:
    with store.transaction() as s:
        key = s.get(ApiKey, run_id)
        if key is None or key.parent_id is not None:
            raise NotFound(f"run {run_id} not found", param="run")
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
            "run": _run_view(key), "child_keys": children,
            "spend": spend_series(charged),
            "ledger": [_ledger_view(r) for r in ledger], "ledger_total": ledger_total or 0,
            "training": [training_job_view(j) for j in training_jobs],
            "evaluations": [evaluation_job_view(j) for j in evaluations],
            "scores": _score_views(s, score_rows),
            "graph": graph,
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


def jobs(store: Store, limit: int) -> dict[str, Any]:
    queues = _queues(store)
    with store.transaction() as s:
        training_jobs = training.jobs(s, in_flight=True, limit=limit)
        evaluations = evaluation.jobs(s, in_flight=True, limit=limit)
        recent = evaluation.jobs(s, in_flight=False, newest_first=True, limit=20)
        return {
            "queues": queues,
            "training": [training_job_view(j) for j in training_jobs],
            "evaluations": [evaluation_job_view(j) for j in evaluations],
            "recent_evaluations": [evaluation_job_view(j) for j in recent],
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
    """The RSI-Index per run and per agent, computed exactly as ``rsigym report`` does."""
    from services.evaluation.report import FORMULA, build_report, build_report_rows, group_rows

    with store.transaction() as s:
        score_views = _score_views(s, evaluation.scores(s))
        keys = [{"id": k.id, "name": k.name, "track": k.track}
                for k in s.scalars(select(ApiKey).where(ApiKey.parent_id.is_(None))).all()]
    rows, notes = build_report_rows(score_views, keys, split)
    report = build_report(group_rows(rows))
    runs = sorted(report.runs, key=lambda r: (r.index is None, -(r.index or 0.0)))
    return {
        "formula": FORMULA, "split": split, "notes": notes, "benchmarks": list(report.benchmarks),
        "runs": [{"run_id": r.run_id, "agent": r.agent, "track": r.track, "index": r.index,
                  "used": len(r.result.included), "of": len(r.result.terms),
                  "terms": [{"benchmark": t.benchmark, "initial": t.initial, "submitted": t.submitted,
                             "term": t.term, "reason": t.reason or ""} for t in r.result.terms]}
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

