"""Seeded official subsets (issue 54 item 4) and the reference system in the report (item 6):
the draw is a pure function of (task ids, N, seed); the report pairs initial and run scores only
on one scope and names every seed; a reference score is shown and never indexed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kit.errors import Unprocessable
from services.evaluation.report import build_report, build_report_rows, group_rows, to_json, to_markdown
from services.evaluation.subsets import draw_order, draw_subset, split_seed_name

IDS = [f"task-{i:03d}" for i in range(40)]


def test_same_seed_same_subset_in_the_splits_order() -> None:
    first = draw_subset(IDS, 10, 23)
    assert first == draw_subset(list(reversed(IDS)), 10, 23)[::-1]  # the same tasks, whatever order given
    assert first == draw_subset(IDS, 10, 23) and len(first) == 10 and first == sorted(first)
    assert set(draw_subset(IDS, 5, 23)) <= set(first)  # nested: a smaller N at one seed is a prefix of the draw


def test_different_seed_different_subset() -> None:
    draws = {tuple(draw_subset(IDS, 10, seed)) for seed in range(8)}
    assert len(draws) == 8


def test_the_draw_is_pinned_across_processes_and_versions() -> None:
    """A hash order (sha256 of "<seed>:<id>"), not random.sample: a golden value catches any change,
    and another interpreter process (its own hash randomisation) draws the same."""
    assert draw_subset(IDS[:20], 5, 23) == ["task-002", "task-004", "task-010", "task-017", "task-019"]
    code = "from services.evaluation.subsets import draw_subset; print(draw_subset([f'task-{i:03d}' for i in range(40)], 10, 23))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345"}, cwd=Path(__file__).resolve().parents[4])
    assert out.stdout.strip() == repr(draw_subset(IDS, 10, 23))


def test_a_subset_larger_than_the_split_is_refused_with_its_param() -> None:
    with pytest.raises(Unprocessable) as err:
        draw_subset(IDS, 41, 23, where="mini/official")
    assert err.value.status == 422 and err.value.param == "subset"
    assert "mini/official has 40" in str(err.value)
    assert draw_subset(IDS, 40, 23) == IDS  # the whole split is a subset of itself
    assert draw_order(IDS, 1) != draw_order(IDS, 2)


def test_split_seed_by_name(tmp_path: Path) -> None:
    generated = {"official": {"generated": {"seed": "gym", "seed_fingerprint": "0123abcd"}}}
    assert split_seed_name(generated, "official", tmp_path) == "gym seed 0123abcd"
    (tmp_path / "benchmark.toml").write_text('name = "he"\n[source]\nsplit_seed = 17\n')
    assert split_seed_name({"official": {}}, "official", tmp_path) == "split_seed 17"
    (tmp_path / "benchmark.toml").write_text('name = "fixed"\n')
    assert split_seed_name({"dev": {}}, "dev", tmp_path) is None


# -- the report: pairing on scope, seeds named, reference apart ----------------------------------


def rec(run: str, score: float, at: str, **kw: Any) -> dict[str, Any]:
    return {"id": f"{run}-{at}", "run_id": run, "benchmark": "mini", "split": "official", "attempts": 1,
            "model": kw.pop("model", "tiny"), "score": score, "status": "succeeded", "created_at": at,
            "split_seed": "gym seed 0123abcd", **kw}


def test_initial_pairs_only_on_the_same_subset_and_reference_stays_out_of_the_index() -> None:
    subset = {"subset": 2, "subset_seed": 23}
    scores = [
        rec("initial", 0.9, "01"),                                      # the whole split: not the run's scope
        rec("initial", 0.5, "02", subset=2, subset_seed=7),             # another seed: not comparable
        rec("initial", 0.2, "03", **subset),
        rec("reference", 0.8, "04", model="instruct", **subset),
        rec("reference", 0.1, "05", model="instruct"),                  # the whole split: not shown
        rec("r1", 0.6, "06", submission_id="sub_1", **subset),
    ]
    rows, notes = build_report_rows(scores, [{"id": "r1", "name": "agent", "track": "data"}])
    assert notes == [] and [r.run_id for r in rows] == ["r1"]  # the reference is no run
    (row,) = rows
    assert (row.initial, row.submitted) == (0.2, 0.6) and row.reference is not None and row.reference.score == 0.8
    report = build_report(group_rows(rows))
    assert report.runs[0].index == pytest.approx((0.6 - 0.2) / 0.8)  # the reference's 0.8 is nowhere in it
    (bench,) = to_json(report)["runs"][0]["benchmarks"]
    assert (bench["split"], bench["subset"], bench["subset_seed"], bench["split_seed"]) == \
        ("official", 2, 23, "gym seed 0123abcd")
    assert bench["reference"]["model"] == "instruct" and bench["reference"]["in_rsi_index"] is False
    assert bench["reference"]["gap_to_reference"] == pytest.approx(0.2)
    md = to_markdown(report)
    assert "subset seed" in md and "split seed" in md and "gap to reference" in md
    assert "| r1 | mini | official | 2 | 23 | gym seed 0123abcd | 1 |" in md


def test_a_run_on_a_subset_without_a_matching_baseline_is_left_out_naming_the_scope() -> None:
    rows, notes = build_report_rows([rec("initial", 0.2, "01"), rec("r1", 0.6, "02", subset=2, subset_seed=23)], [])
    assert rows == [] and "subset 2 at subset seed 23" in notes[0] and "gym seed 0123abcd" in notes[0]


def test_score_wait_watches_the_cached_baselines_of_the_runs_scope_only() -> None:
    from ops.cli.scoring import watched_records

    scope = {"benchmark": "mini", "split": "official", "attempts": 1, "subset": 2, "subset_seed": 23,
             "split_seed": "gym seed 0123abcd"}
    started = [{"id": "s1", "run_id": "r", **scope}]
    scores = [*started,
              {"id": "b1", "run_id": "initial", "model": "tiny", **scope},                      # cached: watched
              {"id": "b2", "run_id": "initial", "model": "tiny", **scope, "subset_seed": 7},    # another seed
              {"id": "b3", "run_id": "initial", "model": "tiny", **scope, "subset": None, "subset_seed": None},
              {"id": "x1", "run_id": "reference", "model": "instruct", **scope},                # the named reference
              {"id": "x2", "run_id": "reference", "model": "other", **scope}]
    assert [r["id"] for r in watched_records(started, scores, "r", "instruct")] == ["s1", "b1", "x1"]
    assert [r["id"] for r in watched_records(started, scores, "r")] == ["s1", "b1"]
