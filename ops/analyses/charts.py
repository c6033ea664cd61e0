"""The analyses' PNGs, drawn on matplotlib's Agg canvas (no display, no pyplot state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ops.analyses.tool_use import CATEGORIES


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # charts only: keep matplotlib out of the readers

    return Figure(figsize=(width, height), dpi=100)


def _save(fig: Any, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path)
    return path


def best_so_far(run_id: str, series: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    for name, points in sorted(series.items()):
        hours = [p["hours"] for p in points]
        line = ax.step(hours, [p["best"] for p in points], where="post", label=f"{name} best so far")[0]
        ax.scatter(hours, [p["score"] for p in points], s=14, color=line.get_color(), alpha=0.6)
    ax.set_xlabel("research hours since the run started")
    ax.set_ylabel("dev score (the agent's evaluations)")
    ax.set_title(f"Best so far: {run_id}")
    if series:
        ax.legend(fontsize=8)
    return _save(fig, path)


def _stacked(ax: Any, binned: dict[str, Any], title: str) -> None:
    edges, counts = binned["edges_hours"], binned["counts"]
    order = [c for c in CATEGORIES if c in counts] + sorted(c for c in counts if c not in CATEGORIES)
    bottom = [0] * (len(edges) - 1)
    for cat in order:
        ax.bar(edges[:-1], counts[cat], width=binned["bin_hours"], bottom=bottom, align="edge", label=cat)
        bottom = [b + n for b, n in zip(bottom, counts[cat], strict=True)]
    ax.set_title(title)
    ax.set_ylabel("calls")
    if order:
        ax.legend(fontsize=7, ncol=4)


def tool_use(run_id: str, use: dict[str, Any], path: Path) -> Path:
    fig = _figure(8, 6)
    _stacked(fig.add_subplot(2, 1, 1), use["agent_tools"], f"Agent tool calls by category: {run_id}")
    ax = fig.add_subplot(2, 1, 2)
    _stacked(ax, use["platform_calls"], "Metered platform calls by service (ledger)")
    ax.set_xlabel("research hours since the run started")
    return _save(fig, path)


def incidence(data: dict[str, Any], path: Path) -> Path:
    rows = data["categories"]
    fig = _figure(8, 5)
    ax = fig.add_subplot()
    labels = [r["title"] for r in rows]
    executed = [r["executed"] or 0.0 for r in rows]
    attempted = [r["attempted"] or 0.0 for r in rows]
    ax.barh(labels, executed, label="EXECUTED", color="#c0392b")
    ax.barh(labels, attempted, left=executed, label="ATTEMPTED_BLOCKED", color="#f39c12")
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"fraction of audited runs (n = {data['runs']})")
    ax.set_title("Hacking incidence per category")
    ax.legend(fontsize=8)
    return _save(fig, path)
