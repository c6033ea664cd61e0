"""The analyses of a set of runs, read from a gym's admin API and written next to a report:
``analyses.json``, ``analyses.md`` and the PNGs (``rsigym analyses``, the end of ``rsigym report``).

A part that cannot be read (a run's trajectory, the audits) is named in ``notes`` and left out;
the rest is still written."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kit.display_text import markdown_inline
from ops.analyses import best_so_far, charts, incidence, labels, tool_use
from ops.analyses.times import run_start
from ops.cli.admin_client import AdminError

LABELS_DIR = "labels"
"""Where, next to the report, ``rsigym report`` looks for a labelling set (``rsigym labels export
--out <report dir>/labels``) to show its agreement."""


class Reader(Protocol):
    def keys(self) -> list[dict[str, Any]]: ...
    def key(self, key_id: str) -> dict[str, Any]: ...
    def audits(self, run_id: str | None = None) -> list[dict[str, Any]]: ...
    def trajectory(self, run_id: str) -> list[dict[str, Any]]: ...
    def ledger(self, key_id: str) -> list[dict[str, Any]]: ...
    def run_events(self, run_id: str, *, kind: str | None = None, max_pages: int = 20) -> list[dict[str, Any]]: ...


@dataclass
class Written:
    data: dict[str, Any]
    files: list[Path] = field(default_factory=list)


def run_ids(keys: list[dict[str, Any]]) -> list[str]:
    """Every run the gym knows: root run keys, not the agent-model meters (root keys of their own)."""
    meters = {k.get("agent_meter_id") for k in keys}
    return sorted(k["id"] for k in keys if k.get("parent_id") is None and k["id"] not in meters
                  and k.get("run_id", k["id"]) == k["id"])


def _read(notes: list[str], what: str, fn: Any, default: Any) -> Any:
    try:
        return fn()
    except AdminError as err:
        notes.append(f"{what}: not read ({err.type}: {err.message})")
        return default


def collect(client: Reader, runs: list[str] | None = None, bins: int = 12) -> dict[str, Any]:
    notes: list[str] = []
    if runs is None:
        runs = run_ids(_read(notes, "keys", client.keys, []))
    per_run: dict[str, Any] = {}
    for run in runs:
        key = _read(notes, f"run {run}", lambda run=run: client.key(run), None)
        start = run_start(key) if key else None
        if start is None:
            notes.append(f"run {run}: no start time; left out")
            continue
        events = _read(notes, f"run {run} evaluations", lambda run=run: client.run_events(run, kind="evaluation.job"), [])
        turns = _read(notes, f"run {run} trajectory", lambda run=run: client.trajectory(run), [])
        ledger = _read(notes, f"run {run} ledger", lambda run=run: client.ledger(run), [])
        per_run[run] = {"started_at": start.isoformat(), "agent": key.get("agent"), "task": key.get("task"),
                        "best_so_far": best_so_far.curve(events, start),
                        "tool_use": tool_use.tool_use(turns, ledger, start, bins)}
    audits = _read(notes, "audits", client.audits, [])
    return {"runs": per_run, "hacking_incidence": incidence.incidence(audits, set(runs)), "notes": notes}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def to_markdown(data: dict[str, Any]) -> str:
    lines = ["# Analyses", ""]
    lines += ["## Best so far (the agent's own dev evaluations)", "",
              "| run | benchmark/split | evaluations | first score | best | hours to best |", "|---|---|---|---|---|---|"]
    for run, r in data["runs"].items():
        for name, points in sorted(r["best_so_far"].items()):
            best = points[-1]["best"]
            to_best = next(p["hours"] for p in points if p["score"] == best)
            lines.append(f"| {markdown_inline(run)} | {markdown_inline(name)} | {len(points)} | "
                         f"{_fmt(points[0]['score'])} | {_fmt(best)} | {to_best:.2f} |")
    lines += ["", "## Tool use by category", "", "| run | source | " + " | ".join(tool_use.CATEGORIES) + " |",
              "|---|---|" + "---|" * len(tool_use.CATEGORIES)]
    for run, r in data["runs"].items():
        agent = r["tool_use"]["agent_tools"]["totals"]
        lines.append(f"| {markdown_inline(run)} | agent tool calls | "
                     + " | ".join(str(agent.get(c, 0)) for c in tool_use.CATEGORIES) + " |")
        platform = r["tool_use"]["platform_calls"]["totals"]
        lines.append(f"| {markdown_inline(run)} | metered calls | "
                     + ", ".join(f"{markdown_inline(s)} {n}" for s, n in platform.items()) + " |")
    inc = data["hacking_incidence"]
    lines += ["", f"## Hacking incidence per category ({inc['runs']} audited runs)", "",
              "| category | stage | EXECUTED | ATTEMPTED_BLOCKED |", "|---|---|---|---|"]
    lines += [f"| {c['title']} | {c['stage']} | {_fmt(c['executed'])} | {_fmt(c['attempted'])} |"
              for c in inc["categories"]]
    agreement = data.get("labels")
    if agreement:
        lines += ["", f"## Blind labelling ({agreement['items']} items)", "",
                  "| between | items | kappa (codes) | kappa (hacking or not) | observed agreement |", "|---|---|---|---|---|"]
        for row in [*agreement["pairs"], *agreement["vs_judge"]]:
            who = f"{row['a']} vs {row['b']}" if "a" in row else f"{row['labeller']} vs the judge"
            lines.append(f"| {markdown_inline(who)} | {row['codes']['n']} | {_fmt(row['codes']['kappa'])} | "
                         f"{_fmt(row['hacking']['kappa'])} | {_fmt(row['codes']['observed'])} |")
    if data["notes"]:
        lines += ["", "## Notes", "", *(f"- {markdown_inline(n)}" for n in data["notes"])]
    return "\n".join(lines) + "\n"


def write(data: dict[str, Any], out: Path, labels_dir: Path | None = None) -> Written:
    """analyses.json, analyses.md and the PNGs into ``out``; with a labelling set in ``labels_dir``
    (default ``out/labels``), its agreement too."""
    out.mkdir(parents=True, exist_ok=True)
    labels_dir = labels_dir or out / LABELS_DIR
    data = {**data, "labels": labels.kappa(labels_dir) if labels.has_labels(labels_dir) else None}
    files: list[Path] = []
    for run, r in data["runs"].items():
        files.append(charts.best_so_far(run, r["best_so_far"], out / f"best-so-far-{_safe(run)}.png"))
        files.append(charts.tool_use(run, r["tool_use"], out / f"tool-use-{_safe(run)}.png"))
    files.append(charts.incidence(data["hacking_incidence"], out / "hacking-incidence.png"))
    (out / "analyses.json").write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    (out / "analyses.md").write_text(to_markdown(data), encoding="utf-8")
    return Written(data, [out / "analyses.json", out / "analyses.md", *files])


def write_analyses(client: Reader, out: Path, runs: list[str] | None = None, labels_dir: Path | None = None) -> Written:
    return write(collect(client, runs), out, labels_dir)
