"""RSI-Index: the published example, edge cases, and the report files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from services.evaluation.report import RunScores, ScoreRow, build_report, group_rows, write_report
from services.evaluation.rsi_index import NO_HEADROOM, BenchmarkScore, rsi_index

INITIAL = {"SWE": 0.1767, "TB2": 0.1049, "AIME": 0.3167, "GPQA": 0.5133, "Skills": 0.0165}
SUBMITTED = {"SWE": 0.5033, "TB2": 0.2697, "AIME": 0.9778, "GPQA": 0.8333, "Skills": 0.2121}


def example_scores() -> tuple[BenchmarkScore, ...]:
    return tuple(BenchmarkScore(b, INITIAL[b], SUBMITTED[b]) for b in INITIAL)


def test_published_example_reproduces() -> None:
    result = rsi_index(example_scores())
    assert result.index is not None
    assert round(result.index, 4) == 0.4809
    assert [t.benchmark for t in result.terms] == list(INITIAL)
    for t in result.terms:
        assert t.term == pytest.approx((SUBMITTED[t.benchmark] - INITIAL[t.benchmark]) / (1 - INITIAL[t.benchmark]))
    assert result.index == pytest.approx(math.fsum(t.term for t in result.terms) / 5)  # type: ignore[misc]


def test_regression_gives_negative_term() -> None:
    result = rsi_index([BenchmarkScore("SWE", 0.5, 0.25), BenchmarkScore("AIME", 0.0, 0.5)])
    assert result.terms[0].term == pytest.approx(-0.5)
    assert result.index == pytest.approx(0.0)


def test_full_initial_score_is_reported_not_divided() -> None:
    result = rsi_index([BenchmarkScore("solved", 1.0, 1.0), BenchmarkScore("SWE", 0.2, 0.6)])
    solved = result.terms[0]
    assert solved.term is None and solved.reason == NO_HEADROOM and not solved.included
    assert result.excluded == (solved,)
    assert result.index == pytest.approx(0.5)  # the mean is over SWE alone

    nothing = rsi_index([BenchmarkScore("solved", 1.0, 0.9)])
    assert nothing.index is None and nothing.terms[0].reason == NO_HEADROOM
    assert rsi_index([]).index is None


@pytest.mark.parametrize(
    ("initial", "submitted"),
    [(-0.01, 0.5), (0.5, 1.01), (math.nan, 0.5), (0.5, math.inf), (True, 0.5), ("0.5", 0.5)],
)
def test_out_of_range_score_is_refused(initial: object, submitted: object) -> None:
    with pytest.raises(ValueError):
        BenchmarkScore("SWE", initial, submitted)  # type: ignore[arg-type]


def test_duplicate_benchmark_is_refused() -> None:
    with pytest.raises(ValueError, match="more than once"):
        rsi_index([BenchmarkScore("SWE", 0.1, 0.2), BenchmarkScore("SWE", 0.1, 0.3)])


def test_agent_index_is_mean_of_its_runs() -> None:
    flat = [
        ScoreRow("run-a", "alice", "cloud", "SWE", 0.2, 0.6),  # 0.5
        ScoreRow("run-b", "alice", "local", "SWE", 0.5, 0.25),  # -0.5
        ScoreRow("run-c", "alice", "cloud", "done", 1.0, 1.0),  # no index
        ScoreRow("run-d", "bob", "cloud", "SWE", 0.0, 0.75),
    ]
    report = build_report(group_rows(flat))
    alice, bob = report.agents
    assert alice.run_ids == ("run-a", "run-b", "run-c")
    assert alice.tracks == ("cloud", "local")
    assert alice.runs_without_index == ("run-c",)
    assert alice.index == pytest.approx(0.0)
    assert bob.index == pytest.approx(0.75)
    with pytest.raises(ValueError, match="more than one agent"):
        group_rows([flat[0], ScoreRow("run-a", "bob", "cloud", "TB2", 0.1, 0.2)])


def _distinct_colours(path: Path) -> int:
    with Image.open(path) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None
    return len(colours)


def test_report_writes_table_markdown_json_and_charts(tmp_path: Path) -> None:
    rows = [
        RunScores("run-1", "agent-x", "cloud", example_scores()),
        RunScores("run-2", "agent-x", "local", (BenchmarkScore("SWE", 0.5, 0.25), BenchmarkScore("Done/All", 1.0, 1.0))),
    ]
    console = Console(record=True, width=200)
    files = write_report(rows, tmp_path / "out", console=console)

    text = console.export_text()
    assert "RSI-Index per agent" in text and "run-1" in text and "0.4809" in text
    assert NO_HEADROOM in text

    md = files.markdown.read_text()
    assert files.markdown.name == "report.md"
    assert "| run-1 | agent-x | cloud |" in md and "0.4809" in md and "-0.5000" in md and NO_HEADROOM in md

    data = json.loads(files.json.read_text())
    assert files.json.name == "report.json"
    run1, run2 = data["runs"]
    assert round(run1["rsi_index"], 4) == 0.4809
    assert run1["rsi_index"] == rsi_index(example_scores()).index  # full precision, not rounded
    swe = next(b for b in run1["benchmarks"] if b["benchmark"] == "SWE")
    assert swe["initial"] == 0.1767 and swe["submitted"] == 0.5033
    assert swe["term"] == pytest.approx((0.5033 - 0.1767) / (1 - 0.1767), abs=0, rel=1e-15)
    assert run2["rsi_index"] == pytest.approx(-0.5)
    assert run2["excluded"] == [{"benchmark": "Done/All", "reason": NO_HEADROOM}]
    (agent,) = data["agents"]
    assert agent["runs"] == ["run-1", "run-2"]
    assert agent["rsi_index"] == pytest.approx((run1["rsi_index"] - 0.5) / 2)

    assert set(files.charts) == {*INITIAL, "Done/All"}
    assert files.charts["SWE"].name == "SWE.png"
    assert files.charts["Done/All"].parent == tmp_path / "out"  # the slash does not make a folder
    for path in files.charts.values():
        with Image.open(path) as image:
            assert image.format == "PNG"
            assert image.width > 200 and image.height > 200
        assert _distinct_colours(path) > 10
