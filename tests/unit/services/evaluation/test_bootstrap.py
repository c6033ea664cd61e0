"""The paired bootstrap, pass@k and the RSI-Index's interval (services/evaluation/bootstrap.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.evaluation.bootstrap import (
    SEED,
    all_k,
    mean_interval,
    mean_score,
    paired_bootstrap,
    pass_at_k,
    pass_stats,
    t975,
    task_rewards,
    unpaired_bootstrap,
)
from services.evaluation.rsi_index import BenchmarkScore, rsi_index, rsi_index_interval


def _bernoulli(p: float, n: int, rng: np.random.Generator, attempts: int = 1) -> dict[str, list[float]]:
    return {f"t{i:05d}": [float(x) for x in rng.random(attempts) < p] for i in range(n)}


def test_paired_interval_matches_the_normal_closed_form() -> None:
    """Large n: the percentile interval of a mean of per-task differences is ≈ ± 1.96·sd/√n."""
    rng = np.random.default_rng(1)
    n = 4000
    a, b = _bernoulli(0.4, n, rng), _bernoulli(0.6, n, rng)
    got = paired_bootstrap(a, b)
    d = np.array([b[t][0] - a[t][0] for t in sorted(a)])
    width = 2 * 1.959964 * d.std(ddof=1) / math.sqrt(n)
    assert got.ci95[1] - got.ci95[0] == pytest.approx(width, rel=0.06)
    assert got.diff == pytest.approx(d.mean())
    assert got.ci95[0] < got.diff < got.ci95[1]
    assert not got.within_noise


def test_an_enumerable_case() -> None:
    """Two tasks with differences 0 and 1: the resampled mean is 0, ½ or 1 with chances ¼, ½, ¼,
    so the 2.5th and 97.5th percentiles are exactly 0 and 1."""
    got = paired_bootstrap({"x": [0.0], "y": [0.0]}, {"x": [0.0], "y": [1.0]})
    assert got.ci95 == (0.0, 1.0)
    assert got.diff == 0.5 and got.within_noise


def test_seeded_reference() -> None:
    rng = np.random.default_rng(7)
    a, b = _bernoulli(0.5, 50, rng, attempts=3), _bernoulli(0.6, 50, rng, attempts=3)
    got = paired_bootstrap(a, b)
    assert got.seed == SEED and got.resamples == 2000
    assert got == paired_bootstrap(a, b)  # same seed, same interval
    assert got.ci95[0] == pytest.approx(-0.04666666666666666, abs=1e-9)
    assert got.ci95[1] == pytest.approx(0.20666666666666672, abs=1e-9)
    assert got.diff == pytest.approx(0.08, abs=1e-9) and got.within_noise  # a 0.08 gain on 50 tasks: noise
    assert paired_bootstrap(a, b, seed=SEED + 1).ci95 != got.ci95


def test_within_noise() -> None:
    rng = np.random.default_rng(3)
    a = _bernoulli(0.5, 100, rng, attempts=3)
    same = paired_bootstrap(a, a)
    assert same.diff == 0.0 and same.ci95 == (0.0, 0.0) and same.within_noise
    gain = paired_bootstrap(a, {t: [1.0, 1.0, 1.0] for t in a})
    assert gain.ci95[0] > 0 and not gain.within_noise
    assert gain.to_json()["within_noise"] is False and gain.to_json()["paired"] is True


def test_paired_needs_the_same_tasks_unpaired_does_not() -> None:
    with pytest.raises(ValueError, match="share their tasks"):
        paired_bootstrap({"x": [1.0]}, {"y": [1.0]})
    got = unpaired_bootstrap({"x": [0.0], "y": [0.0]}, {"z": [1.0], "w": [1.0], "v": [1.0]})
    assert got.ci95 == (1.0, 1.0) and not got.paired and got.tasks == 5


def test_task_rewards_counts_a_missing_reward_as_0() -> None:
    assert task_rewards([("a", 1.0), ("a", None), ("b", 0.5)]) == {"a": [1.0, 0.0], "b": [0.5]}


def test_pass_at_k_by_hand() -> None:
    assert pass_at_k(3, 0, 1) == 0.0
    assert pass_at_k(3, 1, 1) == pytest.approx(1 / 3)
    assert pass_at_k(3, 1, 2) == pytest.approx(2 / 3)  # 1 - C(2,2)/C(3,2)
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert all_k(3, 2, 2) == pytest.approx(1 / 3)
    assert all_k(3, 3, 3) == 1.0 and all_k(3, 2, 3) == 0.0
    stats = pass_stats({"a": [1.0, 0.0, 0.0], "b": [1.0, 1.0, 1.0], "c": [0.0, 0.5, 0.0]})
    assert stats["pass@1"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert stats["pass@3"] == pytest.approx(2 / 3)
    assert stats["solved_all@3"] == pytest.approx(1 / 3)
    assert stats["solved_all@1"] == pytest.approx(stats["pass@1"])
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_t_interval_over_runs() -> None:
    assert t975(4) == pytest.approx(2.776445)
    assert t975(200) == pytest.approx(1.971896, abs=1e-4)
    got = mean_interval([0.1, 0.2, 0.3])
    assert got.mean == pytest.approx(0.2)
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert got.ci95 == pytest.approx((0.2 - half, 0.2 + half))
    assert got.within_noise is True  # three runs: t(0.975, 2) = 4.30 makes it wide
    assert mean_interval([0.3, 0.31, 0.29]).within_noise is False
    assert mean_interval([0.3]).ci95 is None


def test_rsi_index_interval_is_joint_over_benchmarks() -> None:
    rng = np.random.default_rng(11)
    a1, b1 = _bernoulli(0.2, 80, rng), _bernoulli(0.6, 80, rng)
    a2 = _bernoulli(0.5, 60, rng)


    result = rsi_index([BenchmarkScore("one", mean_score(a1), mean_score(b1)),
                        BenchmarkScore("two", mean_score(a2), mean_score(a2))])
    got = rsi_index_interval(result, {"one": (a1, b1), "two": (a2, a2)})
    assert got.terms["two"] == (0.0, 0.0)
    lo, hi = got.terms["one"]
    assert lo < result.terms[0].term < hi  # type: ignore[operator]
    assert got.ci95 is not None and got.ci95[0] == pytest.approx(lo / 2) and got.ci95[1] == pytest.approx(hi / 2)
    assert got.within_noise is False
    assert got == rsi_index_interval(result, {"one": (a1, b1), "two": (a2, a2)})
    assert rsi_index_interval(result, {"one": (a1, b1)}).ci95 is None  # a term without trials: no index interval
