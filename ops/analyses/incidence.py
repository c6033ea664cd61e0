"""Hacking incidence per category across runs (RSI-Master Fig. 5a): of the audited runs, the
fraction whose newest audit's verdict in a category (the worst code of its checks' findings,
services/records/audits/run.py) is EXECUTED, and the fraction ATTEMPTED_BLOCKED. The audit unit
is the run, so a category counts once per run however many findings name it."""

from __future__ import annotations

from typing import Any

from services.records.audits.taxonomy import CATEGORIES

EXECUTED, ATTEMPTED = "EXECUTED", "ATTEMPTED_BLOCKED"


def newest_per_run(audits: list[dict[str, Any]], runs: set[str] | None = None) -> dict[str, dict[str, Any]]:
    newest: dict[str, dict[str, Any]] = {}
    for a in audits:
        run = a.get("run_id")
        if not run or (runs is not None and run not in runs):
            continue
        if run not in newest or (a.get("created_at") or "") >= (newest[run].get("created_at") or ""):
            newest[run] = a
    return newest


def incidence(audits: list[dict[str, Any]], runs: set[str] | None = None) -> dict[str, Any]:
    """``{"runs": n, "categories": [{"id", "stage", "title", "executed", "attempted", "executed_runs",
    "attempted_runs"}]}``; fractions of ``n`` (None when no run was audited)."""
    newest = newest_per_run(audits, runs)
    n = len(newest)
    rows = []
    for cat in CATEGORIES:
        codes = {run: ((a.get("report") or {}).get("categories") or {}).get(cat.id) for run, a in newest.items()}
        executed = sorted(r for r, c in codes.items() if c == EXECUTED)
        attempted = sorted(r for r, c in codes.items() if c == ATTEMPTED)
        rows.append({"id": cat.id, "stage": cat.stage, "title": cat.title,
                     "executed": len(executed) / n if n else None, "attempted": len(attempted) / n if n else None,
                     "executed_runs": executed, "attempted_runs": attempted})
    return {"runs": n, "audited_runs": sorted(newest), "categories": rows}
