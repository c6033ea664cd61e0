"""Uncertainty for every comparison the gym reports: a seeded paired bootstrap, pass@k, and a
mean-over-runs interval.

Why a bootstrap over tasks: a score is avg@k — the mean over tasks of each task's mean reward
over its k attempts — and tasks are the unit a benchmark samples, so the interval must come from
redrawing tasks. Each task's attempts are averaged first (their spread is inside the task's mean),
then tasks are drawn with replacement, ``RESAMPLES`` times, and the 2.5th and 97.5th percentiles
of the resampled statistic are the 95% interval (the percentile method). *Paired*: both systems
were run on the same tasks, so one draw of tasks serves both and the statistic is the mean of the
per-task differences — the task-difficulty variance cancels, as it should when two systems face
the same questions. Systems on different tasks (dev vs official) get an unpaired bootstrap: each
side's tasks drawn on their own.

Seeded (``SEED`` unless the caller names another) so a report regenerated from the same records
shows the same interval. ``within_noise`` is the interval containing 0: the data cannot tell the
two systems apart at 95%.

pass@k is Chen et al. (2021)'s unbiased estimator, ``1 - C(n-c, k) / C(n, k)`` per task with ``n``
attempts of which ``c`` solved it, averaged over tasks; "solved in all k" (the seeds' Fig. 6b) is its
mirror, ``C(c, k) / C(n, k)``: the chance that k attempts drawn from the n all solve it. A task counts
as solved by an attempt whose reward is full (``>= SOLVED``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RESAMPLES = 2000
SEED = 57
SOLVED = 1.0
"""An attempt solved its task when its reward is at least this (full marks)."""
LEVEL = 0.95

Rewards = Mapping[str, Sequence[float]]
"""Task id → the rewards of its attempts."""


def task_rewards(trials: Iterable[tuple[str, float | None]]) -> dict[str, list[float]]:
    """Group (task id, reward) trials by task. A finished job's trial without a reward is the
    agent's failure, its 0 (the seeds' rule, as services/evaluation/jobs.py scores it)."""
    out: dict[str, list[float]] = {}
    for task, reward in trials:
        out.setdefault(task, []).append(0.0 if reward is None else float(reward))
    return out


def _task_means(rewards: Rewards, tasks: Sequence[str]) -> np.ndarray:
    means = []
    for task in tasks:
        attempts = rewards[task]
        if not attempts:
            raise ValueError(f"task {task!r} has no attempts")
        means.append(math.fsum(attempts) / len(attempts))
    return np.asarray(means, dtype=float)


@dataclass(frozen=True, slots=True)
class Comparison:
    """``b`` minus ``a``: the observed difference of the two scores and its 95% interval."""

    a: float
    b: float
    diff: float
    ci95: tuple[float, float]
    tasks: int
    """Tasks drawn from (each side's, for an unpaired comparison: ``a``'s then ``b``'s summed)."""
    paired: bool
    resamples: int = RESAMPLES
    seed: int = SEED

    @property
    def within_noise(self) -> bool:
        return self.ci95[0] <= 0.0 <= self.ci95[1]

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "diff": self.diff, "ci95": list(self.ci95), "within_noise": self.within_noise,
                "tasks": self.tasks, "paired": self.paired, "method": method_note(self.paired),
                "resamples": self.resamples, "seed": self.seed}


def method_note(paired: bool) -> str:
    how = "paired (one task draw for both systems)" if paired else "unpaired (each system's tasks drawn on their own)"
    return f"percentile bootstrap over tasks, attempts averaged per task, {how}"


def percentile_interval(samples: np.ndarray) -> tuple[float, float]:
    tail = (1.0 - LEVEL) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def resampled_diffs(a: Rewards, b: Rewards, rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray:
    """``resamples`` bootstrap draws of mean(b) - mean(a), paired over the tasks both share; the
    two must have the same tasks (a paired comparison on different tasks would be meaningless)."""
    if set(a) != set(b):
        raise ValueError(f"paired systems must share their tasks: {len(set(a) ^ set(b))} tasks in only one of them")
    tasks = sorted(a)
    if not tasks:
        raise ValueError("no tasks to compare")
    d = _task_means(b, tasks) - _task_means(a, tasks)
    idx = rng.integers(0, len(tasks), size=(resamples, len(tasks)))
    return np.asarray(d[idx].mean(axis=1))


def mean_score(rewards: Rewards) -> float:
    """avg@k from the trials: the mean over tasks of each task's mean reward."""
    return float(_task_means(rewards, sorted(rewards)).mean())


def paired_bootstrap(a: Rewards, b: Rewards, *, resamples: int = RESAMPLES, seed: int = SEED) -> Comparison:
    """``b`` vs ``a`` on the same tasks (a submission vs the initial system, a checkpoint vs its parent)."""
    boot = resampled_diffs(a, b, np.random.default_rng(seed), resamples)
    sa, sb = mean_score(a), mean_score(b)
    return Comparison(sa, sb, sb - sa, percentile_interval(boot), len(a), True, resamples, seed)


def unpaired_bootstrap(a: Rewards, b: Rewards, *, resamples: int = RESAMPLES, seed: int = SEED) -> Comparison:
    """``b`` vs ``a`` on different tasks (one system's dev score vs its official score)."""
    if not a or not b:
        raise ValueError("no tasks to compare")
    rng = np.random.default_rng(seed)
    ma, mb = _task_means(a, sorted(a)), _task_means(b, sorted(b))
    boot_a = ma[rng.integers(0, len(ma), size=(resamples, len(ma)))].mean(axis=1)
    boot_b = mb[rng.integers(0, len(mb), size=(resamples, len(mb)))].mean(axis=1)
    sa, sb = float(ma.mean()), float(mb.mean())
    return Comparison(sa, sb, sb - sa, percentile_interval(boot_b - boot_a), len(a) + len(b), False, resamples, seed)


# -- pass@k ----------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): the chance that at least one of k attempts drawn from n (c correct) solves it."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def all_k(n: int, c: int, k: int) -> float:
    """The chance that every one of k attempts drawn from n (c correct) solves it."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return math.comb(c, k) / math.comb(n, k)


def pass_stats(rewards: Rewards) -> dict[str, float]:
    """``pass@k`` and ``solved_all@k`` for k = 1 … the fewest attempts any task had, averaged over
    tasks; empty when there are no tasks."""
    if not rewards:
        return {}
    counts = [(len(r), sum(1 for x in r if x >= SOLVED)) for r in rewards.values()]
    out: dict[str, float] = {}
    for k in range(1, min(n for n, _ in counts) + 1):
        out[f"pass@{k}"] = math.fsum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
        out[f"solved_all@{k}"] = math.fsum(all_k(n, c, k) for n, c in counts) / len(counts)
    return out


# -- runs of one agent on one task -----------------------------------------------------------------

_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
"""Student's t 0.975 quantiles for 1 … 30 degrees of freedom."""


def t975(df: int) -> float:
    """Student's t 0.975 quantile: the table to 30 degrees of freedom, then the Cornish-Fisher
    expansion around the normal's 1.96 (error below 1e-4 there)."""
    if df < 1:
        raise ValueError("need at least one degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True, slots=True)
class MeanInterval:
    """The mean of repeated runs' values with a t-interval (None with fewer than two runs)."""

    n: int
    mean: float
    ci95: tuple[float, float] | None

    METHOD = "Student t-interval over runs (mean ± t(0.975, n-1)·s/√n); none for a single run"

    @property
    def within_noise(self) -> bool | None:
        return None if self.ci95 is None else self.ci95[0] <= 0.0 <= self.ci95[1]

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "ci95": None if self.ci95 is None else list(self.ci95),
                "within_noise": self.within_noise, "method": self.METHOD}


def mean_interval(values: Sequence[float]) -> MeanInterval:
    """A t-interval, not a bootstrap: repeats are few (3-5), and a percentile bootstrap over so few
    values is far too narrow."""
    if not values:
        raise ValueError("no values")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return MeanInterval(n, mean, None)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return MeanInterval(n, mean, (mean - half, mean + half))
