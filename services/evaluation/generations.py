"""Scores across generations: a run's place in its chain, and the chain drawn back to generation 0.

A run started with ``rsigym run start --from RUN`` (a ``RunGeneration`` row, storage/tables.py)
has RUN's accepted system as its initial system; generation 0 is the chain's base model with the
minimal harness; a run started without ``--from`` is generation 1 (its initial system *is*
generation 0). ``rsigym score`` scores both baselines of a later generation on the run's scope
(services/evaluation/service.py), so the report gives such a run two RSI-Indices: against its own
initial system (what this run added) and against generation 0 (what the chain added so far).

The chain (``rsigym report``, ``--chain RUN``) is read from the admin API's score records, whose
views name each scored run's generation facts (``generation``: from run, chain root, generation
number, base model) and initial system. Per benchmark, on the scope of the last run's score
(split, split seed, subset, subset seed, attempts): generation 0's score (the ``initial`` baseline
of the base model + minimal), then each run's submitted score, generation by generation. A
generation not scored on that scope is listed with no score and a note, never filled in. Each
score's 95% interval is a percentile bootstrap over its tasks (attempts averaged per task) when
its job's trials could be read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from services.evaluation.bootstrap import RESAMPLES, SEED, Rewards, percentile_interval
from services.evaluation.rsi_index import ScoreScope
from services.evaluation.schemas import BASELINE_RUNS, INITIAL_RUN, MINIMAL

INTERVAL_METHOD = "percentile bootstrap over tasks, attempts averaged per task"


@dataclass(frozen=True, slots=True)
class Generation:
    """A run's place in its chain, from the score records' ``generation`` facts."""

    generation: int
    from_run_id: str
    chain_root_id: str
    base_model: str
    initial_model: str
    initial_harness: str
    submission_id: str | None = None
    initial_weights_hash: str | None = None

    @property
    def generation_0(self) -> tuple[str, str]:
        """Generation 0's system: the chain's base model with the minimal harness."""
        return self.base_model, MINIMAL

    @property
    def initial_system(self) -> tuple[str, str]:
        return self.initial_model, self.initial_harness

    @classmethod
    def from_api(cls, body: Mapping[str, Any] | None) -> Generation | None:
        if not body:
            return None
        return cls(int(body["generation"]), str(body["from_run_id"]), str(body["chain_root_id"]),
                   str(body["base_model"]), str(body["initial_model"]), str(body["initial_harness"]),
                   body.get("submission_id"), body.get("initial_weights_hash"))

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "from_run_id": self.from_run_id, "chain_root_id": self.chain_root_id,
                "base_model": self.base_model, "initial_model": self.initial_model,
                "initial_harness": self.initial_harness, "submission_id": self.submission_id,
                "initial_weights_hash": self.initial_weights_hash}


def score_interval(rewards: Rewards, *, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """One system's score (avg@k) with its 95% interval: the tasks redrawn with replacement."""
    tasks = sorted(rewards)
    if not tasks or any(not rewards[t] for t in tasks):
        raise ValueError("no trials to draw from")
    means = np.asarray([float(np.mean(rewards[t])) for t in tasks], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(tasks), size=(resamples, len(tasks)))
    return percentile_interval(means[idx].mean(axis=1))


# --- the chain ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChainPoint:
    """One generation's official score on the chain's scope (``score`` None: not scored there)."""

    generation: int
    run_id: str | None
    """None for generation 0 (the base system is no run)."""
    model: str | None
    harness: str | None
    score: float | None
    job_id: str | None = None
    ci95: tuple[float, float] | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class BenchmarkChain:
    benchmark: str
    scope: ScoreScope
    points: tuple[ChainPoint, ...]


@dataclass(frozen=True, slots=True)
class Chain:
    """The chain back to generation 0 from ``run_id`` (its last generation), per benchmark."""

    run_id: str
    runs: tuple[tuple[int, str], ...]
    """(generation, run id) from generation 1 to the last."""
    base_system: tuple[str, str]
    benchmarks: tuple[BenchmarkChain, ...]
    notes: tuple[str, ...] = ()

    def jobs(self) -> list[str]:
        return [p.job_id for b in self.benchmarks for p in b.points if p.job_id]


def _scope(r: Mapping[str, Any]) -> ScoreScope:
    return ScoreScope(split=r["split"], attempts=r["attempts"], subset=r.get("subset"),
                      subset_seed=r.get("subset_seed"), split_seed=r.get("split_seed"))


def _newest(records: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return max(records, key=lambda r: r.get("created_at") or "", default=None)


def _facts(scores: Sequence[Mapping[str, Any]]) -> dict[str, tuple[Generation | None, tuple[str, str] | None]]:
    """Each scored run's generation and initial system, as its score records name them."""
    out: dict[str, tuple[Generation | None, tuple[str, str] | None]] = {}
    for r in scores:
        if r["run_id"] in BASELINE_RUNS or r["run_id"] in out:
            continue
        initial = r.get("initial_system")
        out[r["run_id"]] = (Generation.from_api(r.get("generation")),
                            (initial["model"], initial["harness"]) if initial else None)
    return out


def chain_runs(scores: Sequence[Mapping[str, Any]], run_id: str) -> tuple[list[tuple[int, str]], list[str]]:
    """(generation, run) from generation 1 to ``run_id``, following each run's ``from_run_id``, and
    notes on links that could not be followed (a generation never scored: its own from run is
    unknown, so the chain jumps to its root)."""
    facts = _facts(scores)
    runs: list[tuple[int, str]] = []
    notes: list[str] = []
    run, expected = run_id, None
    while True:
        generation = facts.get(run, (None, None))[0]
        if generation is None:
            number = 1 if expected is None else expected
            runs.append((number, run))
            if number > 1:  # a middle generation without scores: its link back is not in the records
                root = facts.get(run_id, (None, None))[0]
                notes.append(f"generation {number} ({run}) has no scores: generations 2..{number - 1} unknown")
                if root is not None and root.chain_root_id != run:
                    runs.append((1, root.chain_root_id))
            break
        runs.append((generation.generation, run))
        if any(r == generation.from_run_id for _, r in runs) or len(runs) > 10_000:
            notes.append(f"{run}: its from run {generation.from_run_id} is already in the chain; stopped")
            break
        run, expected = generation.from_run_id, generation.generation - 1
    return sorted(runs), notes


def build_chain(scores: Sequence[Mapping[str, Any]], run_id: str, *, split: str = "official") -> Chain:
    """The chain from generation 0 to ``run_id`` on each benchmark ``run_id`` was scored on (its
    newest official score's scope); job ids name the trials the intervals come from
    (:func:`with_intervals`)."""
    ok = [r for r in scores if r.get("status") == "succeeded" and r.get("score") is not None
          and r.get("split") == split and not r.get("cell")]
    runs, notes = chain_runs(scores, run_id)
    facts = _facts(scores)
    generation, initial = facts.get(run_id, (None, None))
    base = generation.generation_0 if generation is not None else initial
    if base is None:
        root = facts.get(runs[0][1], (None, None))[1]
        base = root
    benchmarks: list[BenchmarkChain] = []
    for bench in dict.fromkeys(r["benchmark"] for r in ok if r["run_id"] == run_id):
        last = _newest(r for r in ok if r["run_id"] == run_id and r["benchmark"] == bench)
        assert last is not None
        scope = _scope(last)
        on_scope = [r for r in ok if r["benchmark"] == bench and _scope(r) == scope]
        zero = None if base is None else _newest(
            r for r in on_scope if r["run_id"] == INITIAL_RUN and (r["model"], r.get("harness", MINIMAL)) == base)
        points = [_point(0, None, zero, base, "generation 0 (base model, minimal harness) not scored on this scope")]
        for number, run in runs:
            rec = _newest(r for r in on_scope if r["run_id"] == run)
            points.append(_point(number, run, rec, None, f"{run} not scored on this scope"))
        benchmarks.append(BenchmarkChain(bench, scope, tuple(points)))
    return Chain(run_id, tuple(runs), base or ("?", MINIMAL), tuple(benchmarks), tuple(notes))


def _point(number: int, run: str | None, rec: Mapping[str, Any] | None, system: tuple[str, str] | None,
           missing: str) -> ChainPoint:
    if rec is None:
        return ChainPoint(number, run, system[0] if system else None, system[1] if system else None, None,
                          note=missing)
    return ChainPoint(number, run, rec["model"], rec.get("harness", MINIMAL), float(rec["score"]), rec.get("job_id"))


def with_intervals(chain: Chain, trials: Mapping[str, Rewards]) -> Chain:
    """Each point's 95% interval from its job's trials (a point whose trials are absent keeps none)."""
    def point(p: ChainPoint) -> ChainPoint:
        rewards = trials.get(p.job_id or "")
        if p.score is None or not rewards:
            return p
        try:
            return replace(p, ci95=score_interval(rewards))
        except ValueError:
            return p
    return replace(chain, benchmarks=tuple(replace(b, points=tuple(point(p) for p in b.points))
                                           for b in chain.benchmarks))


def chain_ends(scores: Sequence[Mapping[str, Any]], run_ids: Iterable[str]) -> list[str]:
    """The reported runs that end a chain of two or more generations: a run started ``--from``
    another that no reported run was started from. These are drawn automatically."""
    facts = _facts(scores)
    wanted = list(run_ids)
    continued = {g.from_run_id for run in wanted if (g := facts.get(run, (None, None))[0]) is not None}
    return [run for run in wanted if facts.get(run, (None, None))[0] is not None and run not in continued]


def chain_json(chain: Chain, figure: str | None) -> dict[str, Any]:
    return {
        "run_id": chain.run_id,
        "runs": [{"generation": g, "run_id": r} for g, r in chain.runs],
        "generation_0": {"model": chain.base_system[0], "harness": chain.base_system[1]},
        "interval_method": INTERVAL_METHOD, "resamples": RESAMPLES, "seed": SEED,
        "benchmarks": [
            {"benchmark": b.benchmark, "split": b.scope.split, "attempts": b.scope.attempts,
             "subset": b.scope.subset, "subset_seed": b.scope.subset_seed, "split_seed": b.scope.split_seed,
             "points": [{"generation": p.generation, "run_id": p.run_id, "model": p.model, "harness": p.harness,
                         "score": p.score, "ci95": None if p.ci95 is None else list(p.ci95), "job_id": p.job_id,
                         "note": p.note} for p in b.points]}
            for b in chain.benchmarks],
        "notes": list(chain.notes),
        "figure": figure,
    }


def chain_figure_stem(run_id: str) -> str:
    return "chain-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._") or "run")


def draw_chain(chain: Chain, path: Path) -> Path:
    """Official score by generation, one line per benchmark, with the 95% intervals as error bars
    where they exist (a generation not scored on the scope is a gap in its line)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # charts only: keep matplotlib out of readers
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.4, 1.1 * (len(chain.runs) + 1) + 3.0), 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    shift = 0.06  # benchmarks side by side at each generation, so their bars do not overlap
    offset0 = -shift * (len(chain.benchmarks) - 1) / 2
    for i, b in enumerate(chain.benchmarks):
        xs = [p.generation + offset0 + i * shift for p in b.points]
        ys = [np.nan if p.score is None else p.score for p in b.points]
        low = [0.0 if p.ci95 is None or p.score is None else max(0.0, p.score - p.ci95[0]) for p in b.points]
        high = [0.0 if p.ci95 is None or p.score is None else max(0.0, p.ci95[1] - p.score) for p in b.points]
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=4, linewidth=1.6, label=b.benchmark)
    generations = [0, *(g for g, _ in chain.runs)]
    ax.set_xticks(generations, [f"gen {g}" + ("\n(base)" if g == 0 else f"\n{r}")
                                for g, r in [(0, ""), *chain.runs]], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_xlim(-0.5, max(generations) + 0.5)
    ax.set_xlabel("generation")
    ax.set_ylabel("official score")
    ax.set_title(f"chain to {chain.run_id}: official score by generation (95% intervals)")
    ax.grid(alpha=0.3)
    if chain.benchmarks:
        fig.legend(loc="outside lower center", ncols=min(4, len(chain.benchmarks)), fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no official score", transform=ax.transAxes, ha="center", va="center", color="#555555")
    fig.savefig(path, format="png")
    return path
