"""The best-so-far curve of one run: its agent's own evaluations (``evaluation.job`` events of
its record chain, on the splits it may see), each score at the hours since the run started, and
the best score up to then — per benchmark and split, since scores of different benchmarks are not
comparable. The operator's scoring is not here (it is on the operator's record): the curve is
what the agent knew while it researched."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ops.analyses.times import hours_since

EVALUATION_JOB = "evaluation.job"  # services/records/events.py EVALUATION_JOB


def curve(events: list[dict[str, Any]], start: datetime) -> dict[str, list[dict[str, Any]]]:
    """``{"<benchmark>/<split>": [{"hours", "score", "best", "job_id", "model", "harness"}, …]}``,
    oldest first; ``best`` never falls. Failed or unscored evaluations are left out."""
    points: dict[str, list[dict[str, Any]]] = {}
    done = [e for e in events if e.get("kind") == EVALUATION_JOB and (e.get("data") or {}).get("status") == "succeeded"
            and isinstance((e.get("data") or {}).get("score"), (int, float))]
    for e in sorted(done, key=lambda e: (e.get("created_at") or "", e.get("seq") or 0)):
        data = e["data"]
        hours = hours_since(start, e.get("created_at"))
        if hours is None:
            continue
        series = points.setdefault(f"{data.get('benchmark')}/{data.get('split')}", [])
        best = max(float(data["score"]), series[-1]["best"] if series else float("-inf"))
        series.append({"hours": round(hours, 6), "score": float(data["score"]), "best": best,
                       "job_id": data.get("job_id"), "model": data.get("model"), "harness": data.get("harness")})
    return points
