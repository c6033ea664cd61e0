"""The model × harness decomposition's arithmetic and its reading of score records
(services/evaluation/decompose.py); the scored 2×2 end to end is tests/e2e/test_score_decompose.py."""

from __future__ import annotations

from typing import Any

import pytest

from services.evaluation.decompose import (
    CELL_HARNESS,
    CELL_MODEL,
    TRIVIAL_MODEL,
    cell_plans,
    comparison,
    decompose,
    decomposition_view,
)


def test_identical_systems_are_within_noise_and_a_clear_gain_is_not() -> None:
    same = comparison([0.0, 1.0, 0.5, 1.0], [0.0, 1.0, 0.5, 1.0], seed=1)
    assert same == {"estimate": 0.0, "ci95": [0.0, 0.0], "within_noise": True}
    gain = comparison([1.0] * 20, [0.0] * 18 + [1.0] * 2, seed=1)
    assert gain["estimate"] == pytest.approx(0.9) and not gain["within_noise"] and gain["ci95"][0] > 0.5


def test_contributions_add_up_to_the_gain_and_the_interaction_is_the_rest() -> None:
    tasks = [f"t{i}" for i in range(8)]
    initial = dict.fromkeys(tasks, 0.0)
    model = {t: 1.0 if i < 2 else 0.0 for i, t in enumerate(tasks)}  # weights alone: +0.25
    harness = {t: 1.0 if i < 4 else 0.0 for i, t in enumerate(tasks)}  # harness alone: +0.5
    submitted = {t: 1.0 if i < 7 else 0.0 for i, t in enumerate(tasks)}  # both: +0.875
    d = decompose(initial, model, harness, submitted, seed=3)
    c = d["contributions"]
    assert d["tasks"] == 8 and d["gain"]["estimate"] == pytest.approx(0.875)
    assert c["weights"]["estimate"] + c["harness"]["estimate"] == pytest.approx(d["gain"]["estimate"])
    assert c["weights"]["estimate"] == pytest.approx((0.25 + (0.875 - 0.5)) / 2)
    assert c["interaction"]["estimate"] == pytest.approx((0.875 - 0.5) - 0.25)
    for part in (d["gain"], *c.values()):
        low, high = part["ci95"]
        assert low <= part["estimate"] <= high
    assert decompose(initial, model, harness, submitted, seed=3) == d  # seeded


def test_only_a_submission_that_changed_both_gets_mixed_cells() -> None:
    assert cell_plans("ckpt", "hrn_1", "tiny") == [(CELL_MODEL, "ckpt", "minimal"), (CELL_HARNESS, "tiny", "hrn_1")]
    assert cell_plans("tiny", "hrn_1", "tiny") == [] and cell_plans("ckpt", "minimal", "tiny") == []


def _record(run_id: str, model: str, harness: str, job: str, score: float, cell: str | None = None) -> dict[str, Any]:
    return {"id": f"scr_{job}", "run_id": run_id, "submission_id": None if run_id == "initial" else "sub_1",
            "benchmark": "b", "split": "official", "attempts": 2, "subset": None, "subset_seed": None,
            "split_seed": None, "model": model, "harness": harness, "job_id": job, "score": score,
            "status": "succeeded", "cell": cell, "created_at": "2025-01-01T00:00:00"}


def _results(per_task: dict[str, list[float]]) -> list[dict[str, Any]]:
    return [{"task_id": t, "attempt": a, "reward": r, "error": None, "failure_kind": None}
            for t, rewards in per_task.items() for a, r in enumerate(rewards)]


def test_view_reads_the_four_cells_and_leaves_runs_without_cells_out() -> None:
    trials = {"j0": {"a": [0, 0], "b": [0, 1]}, "jm": {"a": [0, 0], "b": [0, 1]},
              "jh": {"a": [1, 1], "b": [1, 1]}, "js": {"a": [1, 1], "b": [1, 1]}}
    scores = [_record("initial", "tiny", "minimal", "j0", 0.25),
              _record("run", "ckpt", "minimal", "jm", 0.25, CELL_MODEL),
              _record("run", "tiny", "hrn", "jh", 1.0, CELL_HARNESS),
              _record("run", "ckpt", "hrn", "js", 1.0)]
    (view,) = decomposition_view(scores, "run", lambda job: _results(trials[job]))
    assert view["status"] == "complete" and view["tasks"] == 2
    assert {n: (c["model"], c["harness"], c["score"]) for n, c in view["cells"].items()} == {
        "initial": ("tiny", "minimal", 0.25), "model": ("ckpt", "minimal", 0.25),
        "harness": ("tiny", "hrn", 1.0), "submitted": ("ckpt", "hrn", 1.0)}
    c = view["contributions"]
    assert c["weights"]["estimate"] == 0.0 and c["weights"]["within_noise"]
    assert c["harness"]["estimate"] == pytest.approx(0.75) == view["gain"]["estimate"]
    # without its cells, a run that changed both was not decomposed: nothing to show
    assert decomposition_view(scores[:1] + scores[3:], "run", lambda job: _results(trials[job])) == []


def test_a_run_that_kept_the_base_model_is_decomposed_trivially() -> None:
    trials = {"j0": {"a": [0, 0], "b": [0, 0]}, "js": {"a": [1, 1], "b": [1, 0]}}
    scores = [_record("initial", "tiny", "minimal", "j0", 0.0), _record("run", "tiny", "hrn", "js", 0.75)]
    (view,) = decomposition_view(scores, "run", lambda job: _results(trials[job]))
    assert view["status"] == "trivial" and view["note"] == TRIVIAL_MODEL and set(view["cells"]) == {"initial", "submitted"}
    assert view["contributions"]["weights"] == {"estimate": 0.0, "ci95": [0.0, 0.0], "within_noise": True,
                                                "by_construction": True}
    assert view["contributions"]["harness"] == view["gain"] and view["gain"]["estimate"] == pytest.approx(0.75)
    assert decomposition_view(scores, "run", lambda job: _results(trials[job]), include_trivial=False) == []
