"""Scores across generations (issue 58 item 2): a later generation's two RSI-Indices (vs its own
initial system, vs generation 0) with their intervals, initial scores paired on the system (model
and harness) and not only the scope, and the chain drawn back to generation 0.

The score records are shaped as ``GET /admin/v1/scores`` answers them: a scored run's record names
its ``initial_system`` and, for a run started ``--from`` an earlier run, its ``generation``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from rich.console import Console

from services.evaluation.generations import build_chain, chain_ends, score_interval
from services.evaluation.report import build_report, build_report_rows, group_rows, report_jobs, write_report

TASKS = [f"t{i}" for i in range(10)]
BASE, H1, H2, CKPT = "tiny", "hrn_1", "hrn_2", "ckpt_2"


def rewards(score: float) -> dict[str, list[float]]:
    """Ten tasks, the first ``10 * score`` solved: the avg@1 is ``score``."""
    solved = round(score * 10)
    return {t: [1.0 if i < solved else 0.0] for i, t in enumerate(TASKS)}


def rec(run: str, model: str, harness: str, score: float, at: str, **kw: Any) -> dict[str, Any]:
    return {"id": f"scr-{run}-{at}", "run_id": run, "benchmark": "mini", "split": "official", "attempts": 1,
            "subset": None, "subset_seed": None, "split_seed": "gym seed 01ab", "model": model, "harness": harness,
            "score": score, "status": "succeeded", "created_at": at, "job_id": f"job-{run}-{at}", **kw}


def generation(n: int, from_run: str, model: str, harness: str) -> dict[str, Any]:
    return {"generation": n, "from_run_id": from_run, "chain_root_id": "r1", "submission_id": f"sub-{from_run}",
            "initial_model": model, "initial_harness": harness, "initial_weights_hash": None, "base_model": BASE}


def chain_records() -> list[dict[str, Any]]:
    """Generation 0 (tiny + minimal) 0.2; r1 (gen 1) submits tiny + hrn_1: 0.5; r2 (gen 2, from r1)
    submits ckpt_2 + hrn_2: 0.7; r3 (gen 3, from r2) 0.8. Each later generation's initial system
    is scored again as a baseline (its own system: same score as the run that submitted it)."""
    minimal = {"model": BASE, "harness": "minimal"}
    return [
        rec("initial", BASE, "minimal", 0.2, "01"),
        rec("r1", BASE, H1, 0.5, "02", submission_id="sub-r1", agent="a", initial_system=minimal, generation=None),
        rec("initial", BASE, H1, 0.5, "03"),  # r2's initial system: newer than gen 0 on the same scope and model
        rec("r2", CKPT, H2, 0.7, "04", submission_id="sub-r2", agent="a",
            initial_system={"model": BASE, "harness": H1}, generation=generation(2, "r1", BASE, H1)),
        rec("initial", CKPT, H2, 0.7, "05"),
        rec("r3", "ckpt_3", H2, 0.8, "06", submission_id="sub-r3", agent="a",
            initial_system={"model": CKPT, "harness": H2}, generation=generation(3, "r2", CKPT, H2)),
    ]


KEYS = [{"id": r, "name": "agent", "track": "joint"} for r in ("r1", "r2", "r3")]


def trials_of(records: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    return {r["job_id"]: rewards(r["score"]) for r in records}


def test_a_later_generation_gets_both_indices_with_their_arithmetic_and_intervals() -> None:
    records = chain_records()
    rows, notes = build_report_rows(records, KEYS)
    assert notes == []
    by_run = {r.run_id: r for r in rows}
    # r1 (generation 1) pairs with generation 0, never with r2's newer initial system of the same model
    assert (by_run["r1"].initial, by_run["r1"].generation, by_run["r1"].generation_0) == (0.2, None, None)
    assert (by_run["r2"].initial, by_run["r2"].generation_0) == (0.5, 0.2)
    assert (by_run["r3"].initial, by_run["r3"].generation_0) == (0.7, 0.2)
    assert by_run["r2"].jobs.generation_0 == "job-initial-01" and "job-initial-01" in report_jobs(rows)

    report = build_report(group_rows(rows), trials=trials_of(records))
    runs = {r.run_id: r for r in report.runs}
    assert runs["r1"].index == pytest.approx((0.5 - 0.2) / 0.8) and runs["r1"].vs_generation_0 is None
    assert runs["r2"].index == pytest.approx((0.7 - 0.5) / 0.5)
    assert runs["r2"].vs_generation_0 is not None
    assert runs["r2"].vs_generation_0.index == pytest.approx((0.7 - 0.2) / 0.8)
    assert runs["r3"].index == pytest.approx((0.8 - 0.7) / 0.3)
    assert runs["r3"].vs_generation_0 is not None
    assert runs["r3"].vs_generation_0.index == pytest.approx((0.8 - 0.2) / 0.8)
    for run in ("r2", "r3"):  # both intervals, from the paired trials, around their estimates
        interval, zero = runs[run].interval, runs[run].vs_generation_0_interval
        assert interval is not None and interval.ci95 is not None and zero is not None and zero.ci95 is not None
        assert interval.ci95[0] <= runs[run].index <= interval.ci95[1]  # type: ignore[operator]
        assert zero.ci95[0] <= runs[run].vs_generation_0.index <= zero.ci95[1]  # type: ignore[union-attr,operator]
    # an agent is ranked on what each run added (vs its own initial system), not on the chain's sum
    (agent,) = report.agents
    assert agent.index == pytest.approx(((0.5 - 0.2) / 0.8 + 0.4 + (0.1 / 0.3)) / 3)
    # ... but later generations are no repeats of a run from the base: the repeat groups hold r1 only
    assert [g.run_ids for g in report.groups] == [("r1",)]


def test_report_files_show_both_indices_and_draw_the_chain(tmp_path: Path) -> None:
    records = chain_records()
    rows, _ = build_report_rows(records, KEYS)
    chains = [build_chain(records, run) for run in chain_ends(records, ["r1", "r2", "r3"])]
    assert [c.run_id for c in chains] == ["r3"]  # r1 and r2 were continued: one chain, drawn once
    files = write_report(group_rows(rows), tmp_path, Console(file=open(tmp_path / "screen.txt", "w"), width=400),
                         trials=trials_of(records), chains=chains)
    body = json.loads(files.json.read_text())
    gen = {r["run_id"]: r["generation"] for r in body["runs"]}
    assert gen["r1"] is None
    assert gen["r2"]["generation"] == 2 and gen["r2"]["from_run_id"] == "r1"
    assert gen["r2"]["initial_system"] == {"model": BASE, "harness": H1}
    assert gen["r2"]["generation_0"] == {"model": BASE, "harness": "minimal"}
    assert gen["r2"]["rsi_index_vs_initial"]["rsi_index"] == pytest.approx(0.4)
    assert gen["r2"]["rsi_index_vs_generation_0"]["rsi_index"] == pytest.approx(0.625)
    assert len(gen["r2"]["rsi_index_vs_generation_0"]["ci95"]) == 2
    (chain,) = body["chains"]
    assert chain["runs"] == [{"generation": g, "run_id": f"r{g}"} for g in (1, 2, 3)]
    (bench,) = chain["benchmarks"]
    points = bench["points"]
    assert [(p["generation"], p["run_id"], p["score"]) for p in points] == \
        [(0, None, 0.2), (1, "r1", 0.5), (2, "r2", 0.7), (3, "r3", 0.8)]
    assert (points[0]["model"], points[0]["harness"]) == (BASE, "minimal")
    for p in points:
        low, high = p["ci95"]
        assert low <= p["score"] <= high and high - low > 0
    assert points[0]["ci95"] == list(score_interval(rewards(0.2)))
    figure = tmp_path / chain["figure"]
    assert chain["figure"] == "chain-r3.png" and files.chain_charts == {"r3": figure}
    with Image.open(figure) as image:
        assert image.format == "PNG" and image.size[0] >= 640
    md = files.markdown.read_text()
    assert "## Generations" in md and "## Chains" in md and "![r3: official score by generation](chain-r3.png)" in md
    assert "| mini | 0 | (base) | tiny | minimal | 0.2000 |" in md
    assert "| mini | 3 | r3 | ckpt_3 | hrn_2 | 0.8000 |" in md
    assert "| r2 | 2 | r1 | tiny + hrn_1 | tiny + minimal | 0.4000 |" in md
    screen = (tmp_path / "screen.txt").read_text()
    assert "Chain to r3" in screen and "RSI-Index vs generation 0" in screen


def test_a_generation_not_scored_on_the_scope_is_a_gap_not_a_number() -> None:
    records = [r for r in chain_records() if r["run_id"] != "r2"]  # r2 never scored
    chain = build_chain(records, "r3")
    assert [(p.generation, p.run_id, p.score) for p in chain.benchmarks[0].points] == \
        [(0, None, 0.2), (1, "r1", 0.5), (2, "r2", None), (3, "r3", 0.8)]
    assert chain.benchmarks[0].points[2].note == "r2 not scored on this scope"
    other_subset = [*chain_records()[:-1], {**chain_records()[-1], "subset": 5, "subset_seed": 3}]
    chain = build_chain(other_subset, "r3")  # the chain's scope is r3's: the earlier ones were on the whole split
    assert [p.score for p in chain.benchmarks[0].points] == [None, None, None, 0.8]


def test_a_run_without_a_generation_pairs_as_before_and_only_with_the_minimal_harness() -> None:
    """Records that name no initial system (an older gym's): the newest minimal-harness initial
    score on the scope, never a later generation's initial system with another harness."""
    records = [{k: v for k, v in r.items() if k not in ("initial_system", "generation")} for r in chain_records()]
    rows, _ = build_report_rows([r for r in records if r["run_id"] in ("initial", "r1")], KEYS)
    (row,) = rows
    assert (row.initial, row.generation, row.generation_0) == (0.2, None, None)
    report = build_report(group_rows(rows))
    assert report.runs[0].vs_generation_0 is None and report.chains == ()
    assert chain_ends(records, ["r1"]) == []
