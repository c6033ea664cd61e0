"""The RSI-Index: how much of each benchmark's headroom a run closed.

For each benchmark with initial score ``s0`` and submitted score ``s`` (both in ``[0, 1]``) the
term is ``(s - s0) / (1 - s0)``; the index is the mean of the terms. Scores stay full-precision
floats here; rounding happens only where numbers are displayed.

A benchmark whose initial score is already 1 has no headroom: it is reported with no term and
a reason, and left out of the mean. A regression (``s < s0``) gives a negative term.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

NO_HEADROOM = "initial score already 1: no headroom"


def _check_score(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class BenchmarkScore:
    """One benchmark's score before (``initial``) and after (``submitted``) a run."""

    benchmark: str
    initial: float
    submitted: float

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
        return BenchmarkTerm(score.benchmark, score.initial, score.submitted, None, NO_HEADROOM)
    return BenchmarkTerm(score.benchmark, score.initial, score.submitted, (score.submitted - score.initial) / headroom)


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
