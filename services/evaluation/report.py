"""RSI-Index report: per run and per agent, to the terminal, Markdown, JSON and PNG charts.

Input is plain data (``RunScores``), so the caller decides where scores come from. Numbers stay
full precision in JSON; tables show four decimals. Charts are drawn on matplotlib's Agg canvas
directly, leaving pyplot's global state alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from services.evaluation.rsi_index import BenchmarkScore, RSIIndex, mean_or_none, rsi_index

FORMULA = "RSI-Index = mean over benchmarks of (s - s0) / (1 - s0)"
DECIMALS = 4


@dataclass(frozen=True, slots=True)
class RunScores:
    """One run's scores: who ran it, on which track, and each benchmark before and after."""

    run_id: str
    agent: str
    track: str
    scores: tuple[BenchmarkScore, ...]


@dataclass(frozen=True, slots=True)
class ScoreRow:
    """One flat row (as a store would return it); ``group_rows`` turns these into ``RunScores``."""

    run_id: str
    agent: str
    track: str
    benchmark: str
    initial: float
    submitted: float


@dataclass(frozen=True, slots=True)
class RunReport:
    run_id: str
    agent: str
    track: str
    result: RSIIndex

    @property
    def index(self) -> float | None:
        return self.result.index


@dataclass(frozen=True, slots=True)
class AgentReport:
    """An agent's index is the mean of its runs' indices; runs without one are listed apart."""

    agent: str
    tracks: tuple[str, ...]
    run_ids: tuple[str, ...]
    runs_without_index: tuple[str, ...]
    index: float | None


@dataclass(frozen=True, slots=True)
class Report:
    benchmarks: tuple[str, ...]
    runs: tuple[RunReport, ...]
    agents: tuple[AgentReport, ...]


@dataclass(frozen=True, slots=True)
class ReportFiles:
    report: Report
    markdown: Path
    json: Path
    charts: dict[str, Path] = field(default_factory=dict)


def group_rows(rows: Iterable[ScoreRow]) -> list[RunScores]:
    """Group flat rows by run, keeping first-seen order; a run's agent and track must agree."""
    runs: dict[str, tuple[str, str, list[BenchmarkScore]]] = {}
    for row in rows:
        agent, track, scores = runs.setdefault(row.run_id, (row.agent, row.track, []))
        if (agent, track) != (row.agent, row.track):
            raise ValueError(f"run {row.run_id!r} has rows for more than one agent or track")
        scores.append(BenchmarkScore(row.benchmark, row.initial, row.submitted))
    return [RunScores(run_id, agent, track, tuple(scores)) for run_id, (agent, track, scores) in runs.items()]


def build_report(rows: Iterable[RunScores]) -> Report:
    runs: list[RunReport] = []
    benchmarks: dict[str, None] = {}
    for row in rows:
        if any(r.run_id == row.run_id for r in runs):
            raise ValueError(f"run {row.run_id!r} given more than once")
        result = rsi_index(row.scores)
        benchmarks.update((t.benchmark, None) for t in result.terms)
        runs.append(RunReport(row.run_id, row.agent, row.track, result))

    by_agent: dict[str, list[RunReport]] = {}
    for run in runs:
        by_agent.setdefault(run.agent, []).append(run)
    agents = tuple(
        AgentReport(
            agent=agent,
            tracks=tuple(dict.fromkeys(r.track for r in agent_runs)),
            run_ids=tuple(r.run_id for r in agent_runs),
            runs_without_index=tuple(r.run_id for r in agent_runs if r.index is None),
            index=mean_or_none(r.index for r in agent_runs if r.index is not None),
        )
        for agent, agent_runs in by_agent.items()
    )
    return Report(tuple(benchmarks), tuple(runs), agents)


# --- display ----------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.{DECIMALS}f}"


def _term_cells(report: Report, run: RunReport) -> list[str]:
    terms = {t.benchmark: t for t in run.result.terms}
    return [fmt(terms[b].term) if b in terms else "-" for b in report.benchmarks]


def _table(title: str, text: list[str], numbers: list[str]) -> Table:
    """Text columns fold when the terminal is narrow; numbers keep all their digits."""
    table = Table(title=title)
    for name in text:
        table.add_column(name, overflow="fold")
    for name in numbers:
        table.add_column(name, justify="right", no_wrap=True, min_width=len(fmt(-0.0)))
    return table


def render_tables(report: Report) -> list[Table]:
    """Long form (one row per run and benchmark), so any number of benchmarks fits a terminal."""
    agents = _table("RSI-Index per agent", ["agent", "tracks", "runs"], ["RSI-Index"])
    for a in report.agents:
        agents.add_row(a.agent, ", ".join(a.tracks), ", ".join(a.run_ids), fmt(a.index))
    runs = _table("RSI-Index per run", ["run", "agent", "track", "benchmarks used"], ["RSI-Index"])
    for r in report.runs:
        runs.add_row(r.run_id, r.agent, r.track, f"{len(r.result.included)} of {len(r.result.terms)}", fmt(r.index))
    scores = _table("Scores and terms", ["run", "benchmark"], ["initial", "submitted", "term"])
    scores.add_column("note", overflow="fold")
    for r in report.runs:
        for t in r.result.terms:
            scores.add_row(r.run_id, t.benchmark, fmt(t.initial), fmt(t.submitted), fmt(t.term), t.reason or "")
    return [agents, runs, scores]


def print_report(report: Report, console: Console) -> None:
    for table in render_tables(report):
        console.print(table)


def _md_cell(value: str) -> str:
    return value.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return lines


def to_markdown(report: Report) -> str:
    lines = ["# RSI-Index report", "", f"`{FORMULA}`; scores in [0, 1], shown to {DECIMALS} decimals.", ""]
    lines += ["## Per agent", ""]
    lines += _md_table(
        ["agent", "tracks", "runs", "RSI-Index"],
        [[a.agent, ", ".join(a.tracks), ", ".join(a.run_ids), fmt(a.index)] for a in report.agents],
    )
    lines += ["", "## Per run", ""]
    lines += _md_table(
        ["run", "agent", "track", *report.benchmarks, "RSI-Index"],
        [[r.run_id, r.agent, r.track, *_term_cells(report, r), fmt(r.index)] for r in report.runs],
    )
    lines += ["", "## Scores", ""]
    lines += _md_table(
        ["run", "benchmark", "initial", "submitted", "term", "note"],
        [
            [r.run_id, t.benchmark, fmt(t.initial), fmt(t.submitted), fmt(t.term), t.reason or ""]
            for r in report.runs
            for t in r.result.terms
        ],
    )
    return "\n".join(lines) + "\n"


def to_json(report: Report) -> dict[str, Any]:
    """Full-precision numbers; ``None`` (no term, no index) becomes JSON ``null``."""
    return {
        "formula": FORMULA,
        "benchmarks": list(report.benchmarks),
        "agents": [
            {
                "agent": a.agent,
                "tracks": list(a.tracks),
                "runs": list(a.run_ids),
                "runs_without_index": list(a.runs_without_index),
                "rsi_index": a.index,
            }
            for a in report.agents
        ],
        "runs": [
            {
                "run_id": r.run_id,
                "agent": r.agent,
                "track": r.track,
                "rsi_index": r.index,
                "benchmarks": [
                    {
                        "benchmark": t.benchmark,
                        "initial": t.initial,
                        "submitted": t.submitted,
                        "term": t.term,
                        "included": t.included,
                        "reason": t.reason,
                    }
                    for t in r.result.terms
                ],
                "excluded": [{"benchmark": t.benchmark, "reason": t.reason} for t in r.result.excluded],
            }
            for r in report.runs
        ],
    }


# --- charts -----------------------------------------------------------------------------------


def chart_filename(benchmark: str, taken: set[str]) -> str:
    """``<benchmark>.png``, with characters unsafe in a path replaced and clashes numbered."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", benchmark).strip("._") or "benchmark"
    name, n = f"{stem}.png", 1
    while name.lower() in taken:
        n += 1
        name = f"{stem}-{n}.png"
    taken.add(name.lower())
    return name


def draw_chart(report: Report, benchmark: str, path: Path) -> Path:
    """Bars of initial vs submitted score for every run that has ``benchmark``."""
    pairs = [(r.run_id, t) for r in report.runs for t in r.result.terms if t.benchmark == benchmark]
    width_in = min(max(6.4, 1.3 * len(pairs) + 2.0), 40.0)
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # charts only: keep matplotlib out of readers
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = list(range(len(pairs)))
    bar = 0.38
    initial = ax.bar([x - bar / 2 for x in xs], [t.initial for _, t in pairs], bar, label="initial", color="#9aa5b1")
    submitted = ax.bar([x + bar / 2 for x in xs], [t.submitted for _, t in pairs], bar, label="submitted", color="#2b7bb9")
    for bars in (initial, submitted):
        ax.bar_label(bars, fmt=f"%.{DECIMALS}f", padding=2, fontsize=8)
    crowded = len(pairs) > 4
    ax.set_xticks(xs, [run_id for run_id, _ in pairs], rotation=20 if crowded else 0, ha="right" if crowded else "center")
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("score")
    ax.set_xlabel("run")
    ax.set_title(f"{benchmark}: initial vs submitted score")
    pad = max(0.0, (2 - len(pairs)) / 2)  # a lone run still gets slim, centred bars
    ax.set_xlim(-0.75 - pad, len(pairs) - 0.25 + pad)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)  # never over a bar
    fig.savefig(path, format="png")
    return path


def write_charts(report: Report, out_dir: Path) -> dict[str, Path]:
    taken: set[str] = set()
    return {b: draw_chart(report, b, out_dir / chart_filename(b, taken)) for b in report.benchmarks}


def write_report(rows: Iterable[RunScores], out_dir: Path | str, console: Console | None = None) -> ReportFiles:
    """Compute the report, print it to ``console`` and write report.md, report.json and charts."""
    report = build_report(rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print_report(report, console or Console())
    md_path = out / "report.md"
    md_path.write_text(to_markdown(report), encoding="utf-8")
    json_path = out / "report.json"
    json_path.write_text(json.dumps(to_json(report), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return ReportFiles(report, md_path, json_path, write_charts(report, out))


# -- rows from score records ------------------------------------------------------------

INITIAL_RUN = "initial"
"""The run id under which an operator records the initial system's scores."""
FINAL_SCORE_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


def _newest(records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    return max(records, key=lambda r: r.get("created_at") or "", default=None)


def build_report_rows(scores: list[dict[str, Any]], keys: list[dict[str, Any]],
                      split: str = "official") -> tuple[list[ScoreRow], list[str]]:
    """Flat RSI-Index rows from the admin API's score records, and notes on what was left out.

    For each scored run (not ``initial``) and benchmark, the newest succeeded record on ``split``
    is the submitted score; the initial score is the newest succeeded ``initial`` record with the
    same benchmark, split and attempts (one on the same model first, when the run kept its base
    model). The run's track comes from its key; its agent from the score record, else the key's name.
    """
    ok = [r for r in scores
          if r.get("status") == "succeeded" and r.get("score") is not None and r.get("split") == split]
    initial = [r for r in ok if r["run_id"] == INITIAL_RUN]
    by_key = {k["id"]: k for k in keys}
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in ok:
        if r["run_id"] != INITIAL_RUN:
            current = latest.get((r["run_id"], r["benchmark"]))
            if current is None or (r.get("created_at") or "") >= (current.get("created_at") or ""):
                latest[(r["run_id"], r["benchmark"])] = r
    rows: list[ScoreRow] = []
    notes: list[str] = []
    runs: dict[str, tuple[str, str]] = {}
    for (run_id, bench), rec in latest.items():
        same = [i for i in initial if (i["benchmark"], i["attempts"]) == (bench, rec["attempts"])]
        base = _newest(i for i in same if i["model"] == rec["model"]) or _newest(same)
        if base is None:
            notes.append(f"{run_id} on {bench}: no initial-system score ({split}, avg@{rec['attempts']}) yet; left out")
            continue
        key = by_key.get(run_id, {})
        agent, track = runs.setdefault(run_id, (rec.get("agent") or key.get("name") or run_id, key.get("track") or "-"))
        rows.append(ScoreRow(run_id=run_id, agent=agent, track=track, benchmark=bench,
                              initial=float(base["score"]), submitted=float(rec["score"])))
    unfinished = sorted({r["run_id"] for r in scores if r.get("status") not in FINAL_SCORE_STATUSES and r["run_id"] != INITIAL_RUN})
    if unfinished:
        notes.append(f"still being scored (not in this report): {', '.join(unfinished)}")
    return rows, notes
