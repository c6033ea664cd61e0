"""The RSI-Index: how much of each benchmark's headroom a run closed.

For each benchmark with initial score ``s0`` and submitted score ``s`` (both in ``[0, 1]``) the
term is ``(s - s0) / (1 - s0)``; the index is the mean of the terms. Scores stay full-precision
floats here; rounding happens only where numbers are displayed.

A benchmark whose initial score is already 1 has no headroom: it is reported with no term and
a reason, and left out of the mean. A regression (``s < s0``) gives a negative term.

``s0`` and ``s`` are comparable only when both were taken on the same tasks the same way: one
:class:`ScoreScope` (split, the seed that drew it, seeded subset and its seed, attempts). The
report pairs them on it (services/evaluation/report.py) and each term carries it, so a reader
sees what the index was computed on. A reference system's score is never an input here.

:func:`rsi_index_interval` gives the index and each term a 95% interval from the trials
(services/evaluation/bootstrap.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from services.evaluation.bootstrap import RESAMPLES, SEED, Rewards, percentile_interval, resampled_diffs

NO_HEADROOM = "initial score already 1: no headroom"


def _check_score(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ScoreScope:
    """What a benchmark's scores were taken on; initial and submitted must share it."""

    split: str
    attempts: int
    subset: int | None = None
    """How many of the split's tasks (services/evaluation/subsets.py); None: all of them."""
    subset_seed: int | None = None
    split_seed: str | None = None
    """The seed that drew the split, by name; None for a fixed split."""

    def describe(self) -> str:
        """``official, avg@3, subset 100 at subset seed 23, split seed: gym seed 1f…``."""
        subset = "all tasks" if self.subset is None else f"subset {self.subset} at subset seed {self.subset_seed}"
        split_seed = f"split seed: {self.split_seed}" if self.split_seed else "fixed split"
        return f"{self.split}, avg@{self.attempts}, {subset}, {split_seed}"


@dataclass(frozen=True, slots=True)
class BenchmarkScore:
    """One benchmark's score before (``initial``) and after (``submitted``) a run, on ``scope``."""

    benchmark: str
    initial: float
    submitted: float
    scope: ScoreScope | None = None

    def __post_init__(self) -> None:
        if not self.benchmark:
            raise ValueError("benchmark name must not be empty")
        object.__setattr__(self, "initial", _check_score(f"{self.benchmark}: initial score", self.initial))
        object.__setattr__(self, "submitted", _check_score(f"{self.benchmark}: submitted score", self.submitted))


@dataclass(frozen=True, slots=True)
class BenchmarkTerm:
    """One benchmark's contribution: ``term`` is None (with ``reason``) when it is excluded."""

    benchmark: str
    initial: float
    submitted: float
    term: float | None
    reason: str | None = None
    scope: ScoreScope | None = None

    @property
    def included(self) -> bool:
        return self.term is not None


@dataclass(frozen=True, slots=True)
class RSIIndex:
    """Per-benchmark terms in input order, and their mean (None when no benchmark has headroom)."""

    terms: tuple[BenchmarkTerm, ...]
    index: float | None

    @property
    def included(self) -> tuple[BenchmarkTerm, ...]:
        return tuple(t for t in self.terms if t.included)

    @property
    def excluded(self) -> tuple[BenchmarkTerm, ...]:
        return tuple(t for t in self.terms if not t.included)


def benchmark_term(score: BenchmarkScore) -> BenchmarkTerm:
    headroom = 1.0 - score.initial
    if headroom <= 0.0:
        return BenchmarkTerm(score.benchmark, score.initial, score.submitted, None, NO_HEADROOM, score.scope)
    return BenchmarkTerm(score.benchmark, score.initial, score.submitted, (score.submitted - score.initial) / headroom,
                         scope=score.scope)


def mean_or_none(values: Iterable[float]) -> float | None:
    """Full-precision mean (``math.fsum``), or None for no values."""
    items = list(values)
    return math.fsum(items) / len(items) if items else None


def rsi_index(scores: Iterable[BenchmarkScore]) -> RSIIndex:
    """Compute the RSI-Index over ``scores``; each benchmark may appear once."""
    terms: list[BenchmarkTerm] = []
    seen: set[str] = set()
    for score in scores:
        if score.benchmark in seen:
            raise ValueError(f"benchmark {score.benchmark!r} given more than once")
        seen.add(score.benchmark)
        terms.append(benchmark_term(score))
    return RSIIndex(tuple(terms), mean_or_none(t.term for t in terms if t.term is not None))


@dataclass(frozen=True, slots=True)
class IndexInterval:
    """The RSI-Index's 95% interval and each included term's, from one joint bootstrap."""

    ci95: tuple[float, float] | None
    """None when an included benchmark had no trials to resample."""
    terms: dict[str, tuple[float, float]]
    resamples: int
    seed: int

    @property
    def within_noise(self) -> bool | None:
        return None if self.ci95 is None else self.ci95[0] <= 0.0 <= self.ci95[1]


def rsi_index_interval(result: RSIIndex, trials: Mapping[str, tuple[Rewards, Rewards]], *,
                       resamples: int = RESAMPLES, seed: int = SEED) -> IndexInterval:
    """Bootstrap the index: each benchmark's tasks are redrawn (paired: initial and submitted
    share the draw) and every included term recomputed, so one resample of the index is the mean
    of that resample's terms. Benchmarks are drawn one after another from one seeded generator.

    The headroom ``1 - s0`` is held at its observed value (it is the term's normaliser): a term's
    interval is its paired-difference interval divided by the headroom. ``trials``: benchmark →
    (initial, submitted) rewards by task; a term without them gets no interval, nor does the index."""
    rng = np.random.default_rng(seed)
    draws: dict[str, np.ndarray] = {}
    for t in result.included:
        if t.benchmark in trials:
            initial, submitted = trials[t.benchmark]
            draws[t.benchmark] = resampled_diffs(initial, submitted, rng, resamples) / (1.0 - t.initial)
    terms = {b: percentile_interval(d) for b, d in draws.items()}
    complete = bool(draws) and len(draws) == len(result.included)
    ci = percentile_interval(np.mean(np.stack(list(draws.values())), axis=0)) if complete else None
    return IndexInterval(ci, terms, resamples, seed)
