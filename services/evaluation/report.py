"""RSI-Index report: per run and per agent, to the terminal, Markdown, JSON and PNG charts.

Input is plain data (``RunScores``), so the caller decides where scores come from. Numbers stay
full precision in JSON; tables show four decimals. Charts are drawn on matplotlib's Agg canvas
directly, leaving pyplot's global state alone. Names an agent may have chosen (a run's agent
name, a key's name) are shown as inert text: plain in the terminal's tables, escaped in Markdown
(kit/display_text.py).

Every score is shown with its scope (split, the seed that drew the split, seeded subset and its
seed, attempts: services/evaluation/subsets.py), and an initial score is paired only with a run's
score on the same scope. A reference system's score (``rsigym score --reference MODEL``) on that
scope is shown next to them, with the gap to it; it never enters the RSI-Index.

Given the trials behind the scores (job id → rewards by task), every comparison carries its 95%
interval and ``within_noise`` (services/evaluation/bootstrap.py): the submission vs the initial
system per benchmark, each RSI-Index term and the run's index (one joint bootstrap), the run's dev
vs official score of its one submitted system; and pass@k / solved-in-all-k per system.

Honest aggregates: a flagged run (its newest audit's verdict) is left out of its agent's index
and listed apart (``include_flagged`` adds the index with them); runs of one agent on one task, track
and budget are grouped, their indices' mean given with a t-interval over runs.

Generations (services/evaluation/generations.py): a run started ``--from`` an earlier run has two
RSI-Indices, against its own initial system (the earlier run's accepted system; the run's index,
the one its agent is ranked on) and against generation 0 (the chain's base model with the minimal
harness), each with its interval. Every chain of two or more generations among the reported runs
is drawn back to generation 0 automatically (``rsigym report --chain RUN``: only RUN's chain, which
may be a single generation): a table and ``chain-<run>.png`` of the official score by generation
per benchmark, with each score's 95% interval where its trials could be read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kit.display_text import PlainTable, markdown_inline
from services.evaluation.bootstrap import (
    RESAMPLES,
    SEED,
    Comparison,
    MeanInterval,
    Rewards,
    mean_interval,
    method_note,
    paired_bootstrap,
    pass_stats,
    unpaired_bootstrap,
)
from services.evaluation.generations import Chain, Generation, chain_figure_stem, chain_json, draw_chain, with_intervals
from services.evaluation.rsi_index import (
    BenchmarkScore,
    BenchmarkTerm,
    IndexInterval,
    RSIIndex,
    ScoreScope,
    mean_or_none,
    rsi_index,
    rsi_index_interval,
)
from services.evaluation.schemas import BASELINE_RUNS, INITIAL_RUN, MINIMAL, REFERENCE_RUN

FORMULA = "RSI-Index = mean over benchmarks of (s - s0) / (1 - s0)"
DECIMALS = 4
NOT_AUDITED = "not audited"
INTEGRITY_UNKNOWN = "unknown"
"""Integrity when the audits could not be read: never passed off as ``not audited``."""


@dataclass(frozen=True, slots=True)
class AuditVerdict:
    """A run's newest audit: ``accepted`` or ``flagged``, and its hacking rate."""

    status: str
    hacking_rate: float | None = None
    created_at: str | None = None


def audited_submission(record: dict[str, Any]) -> str | None:
    """The submission an audit record (``GET /admin/v1/audits``) judged; None: it judged none."""
    if "submission_id" in record:
        return record["submission_id"]
    return ((record.get("report") or {}).get("submission") or {}).get("id")


def scored_submissions(rows: Iterable[ScoreRow]) -> dict[str, set[str | None]]:
    """Each reported run's scored submission ids (one, unless the run was scored before it ended)."""
    out: dict[str, set[str | None]] = {}
    for row in rows:
        out.setdefault(row.run_id, set()).add(row.submission_id)
    return out


def newest_audits(records: Iterable[dict[str, Any]],
                  scored: Mapping[str, set[str | None]] | None = None) -> dict[str, AuditVerdict]:
    """The newest audit of each run, from the admin API's audit records.

    ``scored`` (run → the submission ids its reported scores are of): only an audit of the scored
    submission counts. An audit of an earlier submission does not vouch for a later one, and a
    run whose reported scores are of several submissions has no one audit that vouches for all:
    such runs are left out (``not audited``)."""
    newest: dict[str, dict[str, Any]] = {}
    for r in records:
        if scored is not None:
            wanted = scored.get(r["run_id"], set())
            if len(wanted) != 1 or audited_submission(r) not in wanted:
                continue
        current = newest.get(r["run_id"])
        if current is None or (r.get("created_at") or "") > (current.get("created_at") or ""):
            newest[r["run_id"]] = r
    return {run_id: AuditVerdict(r["status"], r.get("hacking_rate"), r.get("created_at")) for run_id, r in newest.items()}


@dataclass(frozen=True, slots=True)
class SpendPoint:
    """Cumulative USD a service had charged the run, ``hours`` after the run's key was created."""

    hours: float
    usd: float


@dataclass(frozen=True, slots=True)
class RunTimeline:
    """A run's timeline as ``GET /admin/v1/runs/{run_id}/timeline`` answers it (see ops/timeline.py)."""

    run_id: str
    started_at: str
    first_training_job_at: str | None
    time_to_first_training_job_s: float | None
    research_hours: float
    experiments: dict[str, int]
    """total, accepted, flagged, pending"""
    spend_usd: float
    spend_by_service: dict[str, tuple[SpendPoint, ...]]
    first_activity_at: str | None = None
    last_activity_at: str | None = None

    def service_totals(self) -> dict[str, float]:
        return {service: points[-1].usd if points else 0.0 for service, points in self.spend_by_service.items()}


def timeline_from_api(body: dict[str, Any]) -> RunTimeline:
    return RunTimeline(
        run_id=body["run_id"],
        started_at=body["started_at"],
        first_training_job_at=body.get("first_training_job_at"),
        time_to_first_training_job_s=body.get("time_to_first_training_job_s"),
        research_hours=float(body.get("research_hours") or 0.0),
        experiments={k: int(v) for k, v in (body.get("experiments") or {}).items()},
        spend_usd=float(body.get("spend_usd") or 0.0),
        spend_by_service={
            service: tuple(SpendPoint(float(p["hours"]), float(p["usd"])) for p in spend.get("points", []))
            for service, spend in (body.get("spend_by_service") or {}).items()
        },
        first_activity_at=body.get("first_activity_at"),
        last_activity_at=body.get("last_activity_at"),
    )


@dataclass(frozen=True, slots=True)
class ReferenceScore:
    """A reference system's score on a benchmark, on the scope of the run's score there."""

    model: str
    score: float


@dataclass(frozen=True, slots=True)
class ScoreJobs:
    """The evaluation jobs behind one benchmark's scores: their trials give the intervals."""

    initial: str | None = None
    submitted: str | None = None
    dev: str | None = None
    """The run's dev (visible split) scoring of the same submission, for dev vs official."""
    generation_0: str | None = None
    """A later generation's generation-0 (base model + minimal) scoring, on the same tasks."""


@dataclass(frozen=True, slots=True)
class RunScores:
    """One run's scores: who ran it, on which track, and each benchmark before and after."""

    run_id: str
    agent: str
    track: str
    scores: tuple[BenchmarkScore, ...]
    references: Mapping[str, ReferenceScore] = field(default_factory=dict)
    """benchmark → the reference system's score (shown; never in the index)."""
    jobs: Mapping[str, ScoreJobs] = field(default_factory=dict)
    """benchmark → the jobs behind its scores."""
    task: str | None = None
    """The task the run was started on (its key's ``task`` fact): repeated runs group on it."""
    budget_usd: float | None = None
    generation: Generation | None = None
    """Where the run was started ``--from`` an earlier run (None: generation 1)."""
    vs_generation_0: tuple[BenchmarkScore, ...] = ()
    """A later generation's scores against generation 0 (``initial`` is generation 0's score)."""


@dataclass(frozen=True, slots=True)
class ScoreRow:
    """One flat row (as a store would return it); ``group_rows`` turns these into ``RunScores``."""

    run_id: str
    agent: str
    track: str
    benchmark: str
    initial: float
    submitted: float
    submission_id: str | None = None
    """The scored submission (its audit is the run's integrity)."""
    scope: ScoreScope | None = None
    reference: ReferenceScore | None = None
    jobs: ScoreJobs = ScoreJobs()
    task: str | None = None
    budget_usd: float | None = None
    generation: Generation | None = None
    generation_0: float | None = None
    """A later generation's generation-0 score on the same scope (None: not one, or not scored)."""


@dataclass(frozen=True, slots=True)
class BenchmarkEvidence:
    """One benchmark's comparisons, when the trials behind its scores could be read."""

    submitted_vs_initial: Comparison | None = None
    dev_vs_official: Comparison | None = None
    """official minus dev, of the submitted system (the two splits' tasks drawn apart)."""
    passes: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """``initial`` / ``submitted`` → pass@k and solved_all@k."""


@dataclass(frozen=True, slots=True)
class RunReport:
    run_id: str
    agent: str
    track: str
    result: RSIIndex
    integrity: str = NOT_AUDITED
    """The verdict (accepted | flagged) of the newest audit of the scored submission, ``not
    audited``, or ``unknown``."""
    hacking_rate: float | None = None
    references: Mapping[str, ReferenceScore] = field(default_factory=dict)
    interval: IndexInterval | None = None
    evidence: Mapping[str, BenchmarkEvidence] = field(default_factory=dict)
    task: str | None = None
    budget_usd: float | None = None
    generation: Generation | None = None
    vs_generation_0: RSIIndex | None = None
    """A later generation's RSI-Index against generation 0 (``result`` is against its initial system)."""
    vs_generation_0_interval: IndexInterval | None = None

    @property
    def index(self) -> float | None:
        return self.result.index

    @property
    def flagged(self) -> bool:
        return self.integrity == "flagged"


@dataclass(frozen=True, slots=True)
class AgentReport:
    """An agent's index is the mean of its runs' indices; runs without one are listed apart."""

    agent: str
    tracks: tuple[str, ...]
    run_ids: tuple[str, ...]
    runs_without_index: tuple[str, ...]
    index: float | None
    """The mean index of its runs that are not flagged."""
    flagged_runs: tuple[str, ...] = ()
    interval: MeanInterval | None = None
    """The same mean with its t-interval over those runs."""
    index_with_flagged: float | None = None
    """Every run with an index, flagged ones too (shown only with ``include_flagged``)."""


@dataclass(frozen=True, slots=True)
class RunGroup:
    """Runs of one agent on one task, track and budget (``rsigym run start --repeat N``): the mean
    of their indices with a t-interval; flagged runs are left out unless ``include_flagged``."""

    agent: str
    track: str
    task: str | None
    budget_usd: float | None
    run_ids: tuple[str, ...]
    flagged_runs: tuple[str, ...]
    indices: MeanInterval | None


@dataclass(frozen=True, slots=True)
class Report:
    benchmarks: tuple[str, ...]
    runs: tuple[RunReport, ...]
    agents: tuple[AgentReport, ...]
    timelines: tuple[RunTimeline, ...] = ()
    """One per reported run whose timeline was given, in run order."""
    groups: tuple[RunGroup, ...] = ()
    include_flagged: bool = False
    decompositions: Mapping[str, Any] = field(default_factory=dict)
    """run → its model × harness decompositions (services/evaluation/decompose.py), where one exists."""
    chains: tuple[Chain, ...] = ()
    """Chains of generations drawn back to generation 0 (services/evaluation/generations.py)."""


@dataclass(frozen=True, slots=True)
class ReportFiles:
    report: Report
    markdown: Path
    json: Path
    charts: dict[str, Path] = field(default_factory=dict)
    timeline_charts: dict[str, Path] = field(default_factory=dict)
    """run id -> timeline-<run>.png"""
    chain_charts: dict[str, Path] = field(default_factory=dict)
    """last run of a chain -> chain-<run>.png"""


def group_rows(rows: Iterable[ScoreRow]) -> list[RunScores]:
    """Group flat rows by run, keeping first-seen order; a run's agent and track must agree."""
    runs: dict[str, tuple[ScoreRow, list[BenchmarkScore], dict[str, ReferenceScore], dict[str, ScoreJobs],
                          list[BenchmarkScore]]] = {}
    for row in rows:
        first, scores, references, jobs, gen0 = runs.setdefault(row.run_id, (row, [], {}, {}, []))
        if (first.agent, first.track) != (row.agent, row.track):
            raise ValueError(f"run {row.run_id!r} has rows for more than one agent or track")
        scores.append(BenchmarkScore(row.benchmark, row.initial, row.submitted, row.scope))
        jobs[row.benchmark] = row.jobs
        if row.reference is not None:
            references[row.benchmark] = row.reference
        if row.generation is not None and row.generation_0 is not None:
            gen0.append(BenchmarkScore(row.benchmark, row.generation_0, row.submitted, row.scope))
    return [RunScores(run_id, first.agent, first.track, tuple(scores), refs, jobs, first.task, first.budget_usd,
                      first.generation, tuple(gen0))
            for run_id, (first, scores, refs, jobs, gen0) in runs.items()]


def _evidence(run: RunScores, trials: Mapping[str, Rewards], seed: int,
              ) -> tuple[IndexInterval | None, dict[str, BenchmarkEvidence]]:
    """The run's comparisons from the trials of its jobs (``trials``: job id → rewards by task);
    a benchmark whose trials are missing or do not pair gets none, and the index no interval."""
    paired: dict[str, tuple[Rewards, Rewards]] = {}
    evidence: dict[str, BenchmarkEvidence] = {}
    for bench, jobs in run.jobs.items():
        initial, submitted = trials.get(jobs.initial or ""), trials.get(jobs.submitted or "")
        dev = trials.get(jobs.dev or "")
        vs_initial = vs_dev = None
        if initial and submitted and set(initial) == set(submitted):
            paired[bench] = (initial, submitted)
            vs_initial = paired_bootstrap(initial, submitted, seed=seed)
        if dev and submitted:
            vs_dev = unpaired_bootstrap(dev, submitted, seed=seed)
        passes = {name: pass_stats(r) for name, r in (("initial", initial), ("submitted", submitted)) if r}
        if vs_initial or vs_dev or passes:
            evidence[bench] = BenchmarkEvidence(vs_initial, vs_dev, passes)
    result = rsi_index(run.scores)
    interval = rsi_index_interval(result, paired, seed=seed) if paired else None
    return interval, evidence


def _vs_generation_0(run: RunScores, trials: Mapping[str, Rewards], seed: int,
                     ) -> tuple[RSIIndex | None, IndexInterval | None]:
    """A later generation's index against generation 0, with its interval where both systems'
    trials pair (None for a generation-1 run: its initial system is generation 0)."""
    if run.generation is None:
        return None, None
    result = rsi_index(run.vs_generation_0)
    paired: dict[str, tuple[Rewards, Rewards]] = {}
    for bench, jobs in run.jobs.items():
        zero, submitted = trials.get(jobs.generation_0 or ""), trials.get(jobs.submitted or "")
        if zero and submitted and set(zero) == set(submitted):
            paired[bench] = (zero, submitted)
    return result, rsi_index_interval(result, paired, seed=seed) if paired else None


def _groups(runs: list[RunReport], include_flagged: bool) -> tuple[RunGroup, ...]:
    by_key: dict[tuple[str, str, str | None, float | None], list[RunReport]] = {}
    for run in runs:
        if run.generation is not None:  # measured against its own initial system: no repeat of a base run
            continue
        by_key.setdefault((run.agent, run.track, run.task, run.budget_usd), []).append(run)
    groups = []
    for (agent, track, task, budget), members in by_key.items():
        counted = [r.index for r in members if r.index is not None and (include_flagged or not r.flagged)]
        groups.append(RunGroup(agent, track, task, budget, tuple(r.run_id for r in members),
                               tuple(r.run_id for r in members if r.flagged),
                               mean_interval(counted) if counted else None))
    return tuple(groups)


def build_report(rows: Iterable[RunScores], audits: Mapping[str, AuditVerdict] | None = None,
                 timelines: Iterable[RunTimeline] = (), *, integrity_default: str = NOT_AUDITED,
                 trials: Mapping[str, Rewards] | None = None, include_flagged: bool = False,
                 seed: int = SEED, chains: Iterable[Chain] = ()) -> Report:
    """``audits``: each run's newest verdict (runs absent are ``integrity_default``, normally
    ``not audited``; ``audits=None`` with ``INTEGRITY_UNKNOWN`` when they could not be read).
    ``timelines`` of runs not in the report are dropped. ``trials``: job id → rewards by task, for
    the intervals (runs whose jobs are absent get none). ``chains``: the chains of generations to
    draw (:func:`services.evaluation.generations.build_chain`); their intervals come from ``trials``."""
    runs: list[RunReport] = []
    benchmarks: dict[str, None] = {}
    for row in rows:
        if any(r.run_id == row.run_id for r in runs):
            raise ValueError(f"run {row.run_id!r} given more than once")
        result = rsi_index(row.scores)
        benchmarks.update((t.benchmark, None) for t in result.terms)
        verdict = (audits or {}).get(row.run_id)
        interval, evidence = _evidence(row, trials or {}, seed)
        vs_zero, vs_zero_interval = _vs_generation_0(row, trials or {}, seed)
        runs.append(RunReport(row.run_id, row.agent, row.track, result,
                              integrity=verdict.status if verdict else integrity_default,
                              hacking_rate=verdict.hacking_rate if verdict else None, references=row.references,
                              interval=interval, evidence=evidence, task=row.task, budget_usd=row.budget_usd,
                              generation=row.generation, vs_generation_0=vs_zero,
                              vs_generation_0_interval=vs_zero_interval))

    by_agent: dict[str, list[RunReport]] = {}
    for run in runs:
        by_agent.setdefault(run.agent, []).append(run)
    agents = tuple(
        AgentReport(
            agent=agent,
            tracks=tuple(dict.fromkeys(r.track for r in agent_runs)),
            run_ids=tuple(r.run_id for r in agent_runs),
            runs_without_index=tuple(r.run_id for r in agent_runs if r.index is None),
            index=mean_or_none(r.index for r in agent_runs if r.index is not None and not r.flagged),
            flagged_runs=tuple(r.run_id for r in agent_runs if r.flagged),
            interval=_mean_interval([r.index for r in agent_runs if r.index is not None and not r.flagged]),
            index_with_flagged=mean_or_none(r.index for r in agent_runs if r.index is not None),
        )
        for agent, agent_runs in by_agent.items()
    )
    by_run = {t.run_id: t for t in timelines}
    ordered = tuple(by_run[r.run_id] for r in runs if r.run_id in by_run)
    return Report(tuple(benchmarks), tuple(runs), agents, ordered, _groups(runs, include_flagged), include_flagged,
                  chains=tuple(with_intervals(c, trials or {}) for c in chains))


def _mean_interval(values: list[float]) -> MeanInterval | None:
    return mean_interval(values) if values else None


# --- display ----------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.{DECIMALS}f}"


def fmt_ci(ci: tuple[float, float] | list[float] | None) -> str:
    return "n/a" if ci is None else f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def fmt_noise(ci: tuple[float, float] | None) -> str:
    """``within noise`` when the interval holds 0, ``beyond noise`` when not, ``-`` without one."""
    if ci is None:
        return "-"
    return "within noise" if ci[0] <= 0.0 <= ci[1] else "beyond noise"


def _index_ci(run: RunReport) -> tuple[float, float] | None:
    return run.interval.ci95 if run.interval else None


def _term_ci(run: RunReport, benchmark: str) -> tuple[float, float] | None:
    return run.interval.terms.get(benchmark) if run.interval else None


def _agent_header(report: Report) -> list[str]:
    extra = ["RSI-Index with flagged"] if report.include_flagged else []
    return ["agent", "tracks", "runs", "flagged (not in the index)", "RSI-Index", "95% CI (t, over runs)", *extra]


def _agent_cells(report: Report, a: AgentReport) -> list[str]:
    extra = [fmt(a.index_with_flagged)] if report.include_flagged else []
    return [a.agent, ", ".join(a.tracks), ", ".join(a.run_ids), _flagged_cell(a), fmt(a.index),
            fmt_ci(a.interval.ci95 if a.interval else None), *extra]


GROUP_HEADER = ["agent", "track", "task", "budget USD", "runs", "flagged", "mean RSI-Index", "95% CI (t, over runs)"]


def _group_cells(g: RunGroup) -> list[str]:
    return [g.agent, g.track, g.task or "-", "-" if g.budget_usd is None else f"{g.budget_usd:g}",
            str(len(g.run_ids)), str(len(g.flagged_runs)), fmt(g.indices.mean if g.indices else None),
            fmt_ci(g.indices.ci95 if g.indices else None)]


COMPARISON_HEADER = ["run", "benchmark", "comparison", "a", "b", "diff (b - a)", "95% CI", "noise"]


def _comparison_rows(report: Report) -> list[list[str]]:
    rows = []
    for r in report.runs:
        for bench, ev in r.evidence.items():
            for name, c in (("submitted vs initial", ev.submitted_vs_initial),
                            ("official vs dev (same system)", ev.dev_vs_official)):
                if c is not None:
                    rows.append([r.run_id, bench, name, fmt(c.a), fmt(c.b), fmt(c.diff), fmt_ci(c.ci95),
                                 fmt_noise(c.ci95)])
    return rows


def _pass_rows(report: Report) -> list[list[str]]:
    return [[r.run_id, bench, system, ", ".join(f"{k} {fmt(v)}" for k, v in stats.items())]
            for r in report.runs for bench, ev in r.evidence.items() for system, stats in ev.passes.items()]


def _term_cells(report: Report, run: RunReport) -> list[str]:
    terms = {t.benchmark: t for t in run.result.terms}
    return [fmt(terms[b].term) if b in terms else "-" for b in report.benchmarks]


def _table(title: str, text: list[str], numbers: list[str]) -> Table:
    """Text columns fold when the terminal is narrow; numbers keep all their digits."""
    table = PlainTable(title=title)
    for name in text:
        table.add_column(name, overflow="fold")
    for name in numbers:
        table.add_column(name, justify="right", no_wrap=True, min_width=len(fmt(-0.0)))
    return table


def scope_cells(scope: ScoreScope | None) -> list[str]:
    """split, subset size, subset seed, split seed: each named, ``all`` / ``-`` / ``fixed`` when none."""
    if scope is None:
        return ["-", "-", "-", "-"]
    return [scope.split, "all" if scope.subset is None else str(scope.subset),
            "-" if scope.subset_seed is None else str(scope.subset_seed), scope.split_seed or "fixed"]


SCOPE_HEADER = ["split", "subset", "subset seed", "split seed"]


def reference_cells(run: RunReport, t: BenchmarkTerm) -> list[str]:
    """The reference system's model and score, and the gap to it (reference minus submitted)."""
    ref = run.references.get(t.benchmark)
    return ["-", "n/a", "n/a"] if ref is None else [ref.model, fmt(ref.score), fmt(ref.score - t.submitted)]


REFERENCE_HEADER = ["reference", "reference score", "gap to reference"]


def _flagged_cell(a: AgentReport) -> str:
    return f"{len(a.flagged_runs)} of {len(a.run_ids)}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "no training job"
    s = max(0, round(seconds))
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def fmt_usd(usd: float) -> str:
    return f"{usd:.6f}"


def _experiments_cell(t: RunTimeline) -> str:
    e = t.experiments
    return f"{e.get('total', 0)} ({e.get('accepted', 0)} accepted, {e.get('flagged', 0)} flagged, " \
           f"{e.get('pending', 0)} pending)"


def _services_cell(t: RunTimeline) -> str:
    return ", ".join(f"{service} {fmt_usd(usd)}" for service, usd in t.service_totals().items()) or "-"


def fmt_when(iso: str) -> str:
    """``2025-01-01 00:02 UTC`` from an ISO timestamp (minutes are enough to read a timeline)."""
    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return iso


def _timeline_row(t: RunTimeline) -> list[str]:
    return [t.run_id, fmt_when(t.started_at), fmt_duration(t.time_to_first_training_job_s), f"{t.research_hours:.2f}",
            _experiments_cell(t), fmt_usd(t.spend_usd), _services_cell(t)]


TIMELINE_HEADER = ["run", "started", "to first training job", "research hours", "experiments", "spend USD",
                   "spend by service"]


GENERATION_HEADER = ["run", "generation", "from run", "initial system", "generation 0", "RSI-Index vs initial",
                     "95% CI", "RSI-Index vs generation 0", "95% CI (vs generation 0)"]


def _system(model: str, harness: str) -> str:
    return f"{model} + {harness}"


def _generation_rows(report: Report) -> list[list[str]]:
    """Runs started ``--from`` an earlier run: both indices (a generation-1 run's initial system is
    generation 0, so it has one index and no row here)."""
    rows = []
    for r in report.runs:
        g = r.generation
        if g is None:
            continue
        zero = r.vs_generation_0
        zero_ci = r.vs_generation_0_interval.ci95 if r.vs_generation_0_interval else None
        rows.append([r.run_id, str(g.generation), g.from_run_id, _system(*g.initial_system), _system(*g.generation_0),
                     fmt(r.index), fmt_ci(_index_ci(r)), fmt(zero.index if zero else None), fmt_ci(zero_ci)])
    return rows


CHAIN_HEADER = ["benchmark", "generation", "run", "model", "harness", "official score", "95% CI", "note"]


def _chain_rows(chain: Chain) -> list[list[str]]:
    return [[b.benchmark, str(p.generation), p.run_id or "(base)", p.model or "-", p.harness or "-", fmt(p.score),
             fmt_ci(p.ci95), p.note or ""] for b in chain.benchmarks for p in b.points]


def _generation_tables(report: Report) -> list[Table]:
    """Both indices of the later generations, and each chain by generation."""
    tables = []
    generations = _generation_rows(report)
    if generations:
        table = _table("Generations: RSI-Index vs the run's initial system and vs generation 0",
                       GENERATION_HEADER[:5], GENERATION_HEADER[5:])
        for row in generations:
            table.add_row(*row)
        tables.append(table)
    for chain in report.chains:
        table = _table(f"Chain to {chain.run_id}: official score by generation", CHAIN_HEADER[:5], CHAIN_HEADER[5:7])
        table.add_column("note", overflow="fold")
        for row in _chain_rows(chain):
            table.add_row(*row)
        tables.append(table)
    return tables


def render_tables(report: Report) -> list[Table]:
    """Long form (one row per run and benchmark), so any number of benchmarks fits a terminal."""
    header = _agent_header(report)
    agents = _table("RSI-Index per agent (flagged runs left out)", header[:4], header[4:])
    for a in report.agents:
        agents.add_row(*_agent_cells(report, a))
    runs = _table("RSI-Index per run", ["run", "agent", "track", "benchmarks used", "integrity"],
                  ["hacking rate", "RSI-Index", "95% CI"])
    runs.add_column("noise", overflow="fold")
    for r in report.runs:
        runs.add_row(r.run_id, r.agent, r.track, f"{len(r.result.included)} of {len(r.result.terms)}", r.integrity,
                     fmt(r.hacking_rate), fmt(r.index), fmt_ci(_index_ci(r)), fmt_noise(_index_ci(r)))
    scores = _table("Scores and terms", ["run", "benchmark", *SCOPE_HEADER],
                    ["initial", "submitted", "term", "term 95% CI"])
    for name in REFERENCE_HEADER:
        scores.add_column(name, overflow="fold")
    scores.add_column("note", overflow="fold")
    for r in report.runs:
        for t in r.result.terms:
            scores.add_row(r.run_id, t.benchmark, *scope_cells(t.scope), fmt(t.initial), fmt(t.submitted), fmt(t.term),
                           fmt_ci(_term_ci(r, t.benchmark)), *reference_cells(r, t), t.reason or "")
    tables = [agents, runs, scores, *_generation_tables(report)]
    if report.groups:
        groups = _table("Runs of one agent on one task", GROUP_HEADER[:4], GROUP_HEADER[4:])
        for g in report.groups:
            groups.add_row(*_group_cells(g))
        tables.append(groups)
    comparisons = _comparison_rows(report)
    if comparisons:
        table = _table("Comparisons (95% bootstrap intervals)", COMPARISON_HEADER[:3], COMPARISON_HEADER[3:7])
        table.add_column("noise", overflow="fold")
        for row in comparisons:
            table.add_row(*row)
        tables.append(table)
    if report.timelines:
        timeline = PlainTable(title="Timeline per run")
        for name in TIMELINE_HEADER:
            timeline.add_column(name, overflow="fold")
        for tl in report.timelines:
            timeline.add_row(*_timeline_row(tl))
        tables.append(timeline)
    return tables


def print_report(report: Report, console: Console) -> None:
    for table in render_tables(report):
        console.print(table)


def _md_cell(value: str) -> str:
    return markdown_inline(value)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return lines


def to_markdown(report: Report) -> str:
    lines = ["# RSI-Index report", "", f"`{FORMULA}`; scores in [0, 1], shown to {DECIMALS} decimals.", "",
             f"95% intervals: {method_note(True)}, {RESAMPLES} resamples at seed {SEED}; the index's terms are "
             "drawn jointly (each benchmark's tasks) with the headroom 1 - s0 held at its observed value. "
             "*Within noise*: the interval holds 0.", ""]
    lines += ["## Per agent", ""]
    lines += ["Flagged runs (newest audit of the scored submission) are not in an agent's RSI-Index"
              + (" (the last column includes them)." if report.include_flagged
                 else "; `rsigym report --include-flagged` adds the index with them."), ""]
    lines += _md_table(_agent_header(report), [_agent_cells(report, a) for a in report.agents])
    lines += ["", "## Per run", ""]
    lines += _md_table(
        ["run", "agent", "track", *report.benchmarks, "RSI-Index", "95% CI", "integrity", "hacking rate"],
        [[r.run_id, r.agent, r.track, *_term_cells(report, r), fmt(r.index), fmt_ci(_index_ci(r)), r.integrity,
          fmt(r.hacking_rate)] for r in report.runs],
    )
    generations = _generation_rows(report)
    if generations:
        lines += ["", "## Generations", "",
                  "A run started `--from` an earlier run: its RSI-Index against its own initial system (the earlier "
                  "run's accepted system; the index above) and against generation 0 (the base model with the "
                  "minimal harness), on the same tasks.", ""]
        lines += _md_table(GENERATION_HEADER, generations)
    if report.chains:
        _, _, chain_figures = _all_chart_names(report)
        lines += ["", "## Chains", "",
                  "Official score by generation on the last run's scope: generation 0 is the base model with the "
                  "minimal harness, generation k the k-th run's submitted system. 95% intervals: percentile "
                  f"bootstrap over tasks ({RESAMPLES} resamples at seed {SEED}).", ""]
        for chain in report.chains:
            lines += [f"### Chain to {_md_cell(chain.run_id)}", ""]
            lines += _md_table(CHAIN_HEADER, _chain_rows(chain))
            lines += [*(f"- {_md_cell(n)}" for n in chain.notes), "",
                      f"![{_md_cell(chain.run_id)}: official score by generation]({chain_figures[chain.run_id]})", ""]
    if report.groups:
        lines += ["", "## Runs of one agent on one task", "",
                  f"Grouped by agent, track, task and budget; {MeanInterval.METHOD}. Runs started from the "
                  "base system only: a later generation is measured against its own initial system (Generations).",
                  ""]
        lines += _md_table(GROUP_HEADER, [_group_cells(g) for g in report.groups])
    lines += ["", "## Scores", ""]
    lines += ["Each initial score is on the run's scope: the same split, split seed, subset, subset seed "
              "and attempts. The reference system is shown for comparison and is not in the RSI-Index.", ""]
    lines += _md_table(
        ["run", "benchmark", *SCOPE_HEADER, "attempts", "initial", "submitted", "term", "term 95% CI",
         *REFERENCE_HEADER, "note"],
        [
            [r.run_id, t.benchmark, *scope_cells(t.scope), str(t.scope.attempts) if t.scope else "-", fmt(t.initial),
             fmt(t.submitted), fmt(t.term), fmt_ci(_term_ci(r, t.benchmark)), *reference_cells(r, t), t.reason or ""]
            for r in report.runs
            for t in r.result.terms
        ],
    )
    comparisons = _comparison_rows(report)
    if comparisons:
        lines += ["", "## Comparisons", "",
                  "Submitted vs initial: paired (same tasks). Official vs dev of the one submitted system: "
                  "unpaired (different tasks).", ""]
        lines += _md_table(COMPARISON_HEADER, comparisons)
    passes = _pass_rows(report)
    if passes:
        lines += ["", "## pass@k and solved in all k", "",
                  "Unbiased estimators over each task's attempts (Chen et al. 2021); solved: full reward.", ""]
        lines += _md_table(["run", "benchmark", "system", "estimates"], passes)
    if report.timelines:
        _, figures = chart_names(report)
        lines += ["", "## Timeline", "",
                  "Research hours: first to last recorded activity of the run's keys. Spend: charged USD.", ""]
        lines += _md_table(TIMELINE_HEADER, [_timeline_row(t) for t in report.timelines])
        for t in report.timelines:
            lines += ["", f"![{_md_cell(t.run_id)}: spend by service over time]({figures[t.run_id]})"]
    return "\n".join(lines) + "\n"


def to_json(report: Report) -> dict[str, Any]:
    """Full-precision numbers; ``None`` (no term, no index) becomes JSON ``null``."""
    _, figures, chain_figures = _all_chart_names(report)
    return {
        "formula": FORMULA,
        "bootstrap": {"method": method_note(True), "resamples": RESAMPLES, "seed": SEED, "level": 0.95,
                      "rsi_index": "tasks of every benchmark redrawn jointly; headroom 1 - s0 held at its observed "
                                   "value", "within_noise": "the 95% interval holds 0"},
        "include_flagged": report.include_flagged,
        "benchmarks": list(report.benchmarks),
        "agents": [
            {
                "agent": a.agent,
                "tracks": list(a.tracks),
                "runs": list(a.run_ids),
                "runs_without_index": list(a.runs_without_index),
                "flagged_runs": list(a.flagged_runs),
                "rsi_index": a.index,
                **_mean_json(a.interval),
                **({"rsi_index_with_flagged": a.index_with_flagged} if report.include_flagged else {}),
            }
            for a in report.agents
        ],
        "groups": [
            {"agent": g.agent, "track": g.track, "task": g.task, "budget_usd": g.budget_usd, "runs": list(g.run_ids),
             "flagged_runs": list(g.flagged_runs), "flagged_included": report.include_flagged,
             "rsi_index": None if g.indices is None else g.indices.to_json()}
            for g in report.groups
        ],
        "runs": [
            {
                "run_id": r.run_id,
                "agent": r.agent,
                "track": r.track,
                "task": r.task,
                "budget_usd": r.budget_usd,
                "rsi_index": r.index,
                "ci95": _list_or_none(_index_ci(r)),
                "within_noise": r.interval.within_noise if r.interval else None,
                "integrity": r.integrity,
                "hacking_rate": r.hacking_rate,
                "benchmarks": [
                    {
                        "benchmark": t.benchmark,
                        **_scope_json(t.scope),
                        "initial": t.initial,
                        "submitted": t.submitted,
                        "term": t.term,
                        "ci95": _list_or_none(_term_ci(r, t.benchmark)),
                        "within_noise": _holds_zero(_term_ci(r, t.benchmark)),
                        **_evidence_json(r.evidence.get(t.benchmark)),
                        "included": t.included,
                        "reason": t.reason,
                        "reference": _reference_json(r.references.get(t.benchmark), t),
                    }
                    for t in r.result.terms
                ],
                "excluded": [{"benchmark": t.benchmark, "reason": t.reason} for t in r.result.excluded],
                "decomposition": report.decompositions.get(r.run_id),
                "generation": _generation_json(r),
            }
            for r in report.runs
        ],
        "timelines": [_timeline_json(t, figures[t.run_id]) for t in report.timelines],
        "chains": [chain_json(c, chain_figures[c.run_id]) for c in report.chains],
    }


def _generation_json(r: RunReport) -> dict[str, Any] | None:
    """A later generation's place in its chain and its two indices (None: generation 1)."""
    if r.generation is None:
        return None
    zero, zero_interval = r.vs_generation_0, r.vs_generation_0_interval
    return {**r.generation.to_json(),
            "initial_system": {"model": r.generation.initial_model, "harness": r.generation.initial_harness},
            "generation_0": {"model": r.generation.base_model, "harness": MINIMAL},
            "rsi_index_vs_initial": {"rsi_index": r.index, "ci95": _list_or_none(_index_ci(r)),
                                     "within_noise": r.interval.within_noise if r.interval else None},
            "rsi_index_vs_generation_0": {
                "rsi_index": zero.index if zero else None,
                "ci95": _list_or_none(zero_interval.ci95 if zero_interval else None),
                "within_noise": zero_interval.within_noise if zero_interval else None,
                "benchmarks": [{"benchmark": t.benchmark, "generation_0": t.initial, "submitted": t.submitted,
                                "term": t.term, "reason": t.reason,
                                "ci95": _list_or_none(zero_interval.terms.get(t.benchmark) if zero_interval else None)}
                               for t in (zero.terms if zero else ())]}}


def _list_or_none(ci: tuple[float, float] | None) -> list[float] | None:
    return None if ci is None else list(ci)


def _holds_zero(ci: tuple[float, float] | None) -> bool | None:
    return None if ci is None else ci[0] <= 0.0 <= ci[1]


def _mean_json(m: MeanInterval | None) -> dict[str, Any]:
    """An agent's index over its runs: its t-interval (none for one run)."""
    return {"runs_in_index": 0 if m is None else m.n, "ci95": None if m is None or m.ci95 is None else list(m.ci95),
            "within_noise": None if m is None else m.within_noise, "interval_method": MeanInterval.METHOD}


def _evidence_json(ev: BenchmarkEvidence | None) -> dict[str, Any]:
    """The submission vs the initial system (paired), official vs dev of the submitted system
    (unpaired), and pass@k per system; null where the trials could not be read."""
    if ev is None:
        return {"comparison": None, "dev_vs_official": None, "pass_at_k": {}}
    return {"comparison": ev.submitted_vs_initial.to_json() if ev.submitted_vs_initial else None,
            "dev_vs_official": ev.dev_vs_official.to_json() if ev.dev_vs_official else None,
            "pass_at_k": {k: dict(v) for k, v in ev.passes.items()}}


def _scope_json(scope: ScoreScope | None) -> dict[str, Any]:
    """The seeds that shaped a score, by name: the split's (``split_seed``) and the subset's."""
    if scope is None:
        return {"split": None, "attempts": None, "subset": None, "subset_seed": None, "split_seed": None}
    return {"split": scope.split, "attempts": scope.attempts, "subset": scope.subset,
            "subset_seed": scope.subset_seed, "split_seed": scope.split_seed}


def _reference_json(ref: ReferenceScore | None, t: BenchmarkTerm) -> dict[str, Any] | None:
    if ref is None:
        return None
    return {"model": ref.model, "score": ref.score, "gap_to_reference": ref.score - t.submitted,
            "initial_gap_to_reference": ref.score - t.initial, "in_rsi_index": False}


def _timeline_json(t: RunTimeline, figure: str) -> dict[str, Any]:
    return {
        "run_id": t.run_id,
        "started_at": t.started_at,
        "first_training_job_at": t.first_training_job_at,
        "time_to_first_training_job_s": t.time_to_first_training_job_s,
        "first_activity_at": t.first_activity_at,
        "last_activity_at": t.last_activity_at,
        "research_hours": t.research_hours,
        "experiments": dict(t.experiments),
        "spend_usd": t.spend_usd,
        "spend_by_service_usd": t.service_totals(),
        "figure": figure,
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


def chart_names(report: Report) -> tuple[dict[str, str], dict[str, str]]:
    """File names of the benchmark charts and of the runs' ``timeline-<run>.png``, never clashing."""
    benchmarks, timelines, _ = _all_chart_names(report)
    return benchmarks, timelines


def _all_chart_names(report: Report) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """:func:`chart_names` and the chains' ``chain-<run>.png``, none clashing with another."""
    taken: set[str] = set()
    benchmarks = {b: chart_filename(b, taken) for b in report.benchmarks}
    timelines = {t.run_id: chart_filename(f"timeline-{t.run_id}", taken) for t in report.timelines}
    chains = {c.run_id: chart_filename(chain_figure_stem(c.run_id), taken) for c in report.chains}
    return benchmarks, timelines, chains


def draw_timeline(timeline: RunTimeline, path: Path) -> Path:
    """Cumulative spend (USD) of each service against hours since the run's key was created:
    one step line per service, and a marker at the first training job."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # charts only: keep matplotlib out of readers
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    end = max((p.hours for points in timeline.spend_by_service.values() for p in points), default=0.0)
    for service, points in timeline.spend_by_service.items():
        xs = [0.0, *(p.hours for p in points), end]
        ys = [0.0, *(p.usd for p in points), points[-1].usd if points else 0.0]
        ax.step(xs, ys, where="post", label=f"{service} ({fmt_usd(ys[-1])} USD)", linewidth=1.8)
    first_job_h = None if timeline.time_to_first_training_job_s is None else timeline.time_to_first_training_job_s / 3600
    if first_job_h is not None:
        ax.axvline(first_job_h, color="#9aa5b1", linestyle="--", linewidth=1, label="first training job")
    if not timeline.spend_by_service:
        ax.text(0.5, 0.5, "no spend recorded", transform=ax.transAxes, ha="center", va="center", color="#555555")
    ax.set_xlim(0, max(end, first_job_h or 0.0) * 1.02 or 1.0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("hours since the run's key was created")
    ax.set_ylabel("cumulative spend (USD)")
    ax.set_title(f"{timeline.run_id}: spend by service (total {fmt_usd(timeline.spend_usd)} USD)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    fig.savefig(path, format="png")
    return path


def write_charts(report: Report, out_dir: Path) -> dict[str, Path]:
    names, _ = chart_names(report)
    return {b: draw_chart(report, b, out_dir / names[b]) for b in report.benchmarks}


def write_timeline_charts(report: Report, out_dir: Path) -> dict[str, Path]:
    _, names = chart_names(report)
    return {t.run_id: draw_timeline(t, out_dir / names[t.run_id]) for t in report.timelines}


def write_chain_charts(report: Report, out_dir: Path) -> dict[str, Path]:
    _, _, names = _all_chart_names(report)
    return {c.run_id: draw_chain(c, out_dir / names[c.run_id]) for c in report.chains}


def write_report(rows: Iterable[RunScores], out_dir: Path | str, console: Console | None = None, *,
                 audits: Mapping[str, AuditVerdict] | None = None, timelines: Iterable[RunTimeline] = (),
                 integrity_default: str = NOT_AUDITED, trials: Mapping[str, Rewards] | None = None,
                 include_flagged: bool = False, decompositions: Mapping[str, Any] | None = None,
                 chains: Iterable[Chain] = ()) -> ReportFiles:
    """Compute the report, print it to ``console`` and write report.md, report.json, the benchmark
    charts, one timeline chart per run with a timeline and one chain chart per chain."""
    report = build_report(rows, audits, timelines, integrity_default=integrity_default, trials=trials,
                          include_flagged=include_flagged, chains=chains)
    report = replace(report, decompositions=dict(decompositions or {}))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print_report(report, console or Console())
    md_path = out / "report.md"
    md_path.write_text(to_markdown(report), encoding="utf-8")
    json_path = out / "report.json"
    json_path.write_text(json.dumps(to_json(report), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return ReportFiles(report, md_path, json_path, write_charts(report, out), write_timeline_charts(report, out),
                       write_chain_charts(report, out))


# -- rows from score records ------------------------------------------------------------

FINAL_SCORE_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


def _newest(records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    return max(records, key=lambda r: r.get("created_at") or "", default=None)


def score_scope(record: dict[str, Any]) -> ScoreScope:
    """A score record's scope (records before subsets scored whole splits: no subset)."""
    return ScoreScope(split=record["split"], attempts=record["attempts"], subset=record.get("subset"),
                      subset_seed=record.get("subset_seed"), split_seed=record.get("split_seed"))


def agent_label(key: dict[str, Any]) -> str | None:
    """Who a run's agent is, as reports group runs: the agent the launcher recorded and its version
    (``claude-code@2.0.14``: runs of two versions are two agents), else the key's name."""
    agent, version = key.get("agent"), key.get("agent_version")
    if agent:
        return f"{agent}@{version}" if version else str(agent)
    return key.get("name") or None


def _same_system(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two score records of one system on one benchmark: the same submission, model, harness, attempts."""
    return all(a.get(f) == b.get(f) for f in ("benchmark", "submission_id", "model", "harness", "attempts"))


def _system_of(record: Mapping[str, Any]) -> tuple[str, str]:
    return record["model"], record.get("harness") or MINIMAL


def _initial_record(rec: Mapping[str, Any], same: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The initial system's score on ``rec``'s scope (``same``): of the system the record names,
    else (an older gym's record) one with the minimal harness, the same model first. Never
    another system: since generations, baselines of one scope may be of several systems."""
    named = rec.get("initial_system")
    if named:
        return _newest(i for i in same if _system_of(i) == (named["model"], named["harness"]))
    minimal = [i for i in same if _system_of(i)[1] == MINIMAL]
    return _newest(i for i in minimal if i["model"] == rec["model"]) or _newest(minimal)


def report_jobs(rows: Iterable[ScoreRow]) -> list[str]:
    """The evaluation jobs whose trials the report's intervals need, each once."""
    return list(dict.fromkeys(j for r in rows for j in (r.jobs.initial, r.jobs.submitted, r.jobs.dev,
                                                        r.jobs.generation_0) if j))


def build_report_rows(scores: list[dict[str, Any]], keys: list[dict[str, Any]],
                      split: str = "official") -> tuple[list[ScoreRow], list[str]]:
    """Flat RSI-Index rows from the admin API's score records, and notes on what was left out.

    For each scored run (not ``initial`` or ``reference``) and benchmark, the newest succeeded
    record on ``split`` is the submitted score; the initial score is the newest succeeded
    ``initial`` record on the same scope (benchmark, split, split seed, subset, subset seed and
    attempts) of the run's initial system: the model and harness the record's ``initial_system``
    names (a later generation's is an earlier run's accepted system; a generation-1 run's is its
    base model with the minimal harness). A record that names none (one read from an older gym):
    an initial record with the minimal harness, on the same model first when the run kept its base
    model. A later generation also gets generation 0's score (its ``generation``'s base model with
    the minimal harness) on that scope. The reference score, if any, is the newest succeeded
    ``reference`` record on that scope. The run's track comes
    from its key; its agent from the score record, else the agent the launcher recorded on its key
    with its version (:func:`agent_label`), else (a key minted otherwise) the key's name. Each row
    names the jobs behind its scores, and the run's newest succeeded score of the same system
    (submission, model, harness, attempts) on another split (``dev``) for dev vs official.
    """
    succeeded = [r for r in scores  # a decomposition cell (services/evaluation/decompose.py) is not the run's score
                 if r.get("status") == "succeeded" and r.get("score") is not None and not r.get("cell")]
    ok = [r for r in succeeded if r.get("split") == split]
    initial = [r for r in ok if r["run_id"] == INITIAL_RUN]
    reference = [r for r in ok if r["run_id"] == REFERENCE_RUN]
    by_key = {k["id"]: k for k in keys}
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in ok:
        if r["run_id"] not in BASELINE_RUNS:
            current = latest.get((r["run_id"], r["benchmark"]))
            if current is None or (r.get("created_at") or "") >= (current.get("created_at") or ""):
                latest[(r["run_id"], r["benchmark"])] = r
    rows: list[ScoreRow] = []
    notes: list[str] = []
    runs: dict[str, tuple[str, str]] = {}
    for (run_id, bench), rec in latest.items():
        scope = score_scope(rec)
        same = [i for i in initial if (i["benchmark"], score_scope(i)) == (bench, scope)]
        base = _initial_record(rec, same)
        if base is None:
            notes.append(f"{run_id} on {bench}: no initial-system score ({scope.describe()}) yet; left out")
            continue
        generation = Generation.from_api(rec.get("generation"))
        zero = None if generation is None else _newest(i for i in same if _system_of(i) == generation.generation_0)
        if generation is not None and zero is None:
            notes.append(f"{run_id} on {bench}: no generation-0 score ({scope.describe()}) yet; "
                         "its RSI-Index vs generation 0 leaves it out")
        ref = _newest(i for i in reference if (i["benchmark"], score_scope(i)) == (bench, scope))
        key = by_key.get(run_id, {})
        agent, track = runs.setdefault(run_id, (rec.get("agent") or agent_label(key) or run_id, key.get("track") or "-"))
        dev = _newest(d for d in succeeded if d["run_id"] == run_id and d.get("split") != split
                      and _same_system(d, rec))
        rows.append(ScoreRow(run_id=run_id, agent=agent, track=track, benchmark=bench,
                              initial=float(base["score"]), submitted=float(rec["score"]),
                              submission_id=rec.get("submission_id"), scope=scope,
                              reference=None if ref is None else ReferenceScore(ref["model"], float(ref["score"])),
                              jobs=ScoreJobs(base.get("job_id"), rec.get("job_id"), dev.get("job_id") if dev else None,
                                             zero.get("job_id") if zero else None),
                              task=key.get("task"), budget_usd=key.get("budget_usd"), generation=generation,
                              generation_0=float(zero["score"]) if zero else None))
    unfinished = sorted({r["run_id"] for r in scores
                         if r.get("status") not in FINAL_SCORE_STATUSES and r["run_id"] not in BASELINE_RUNS})
    if unfinished:
        notes.append(f"still being scored (not in this report): {', '.join(unfinished)}")
    return rows, notes
