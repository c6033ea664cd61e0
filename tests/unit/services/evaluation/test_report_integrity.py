"""`rsigym report`'s integrity column (each run's newest audit) and the runs' timeline figures
and charts, from plain data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from rich.console import Console

from services.evaluation.report import (
    INTEGRITY_UNKNOWN,
    RunScores,
    build_report,
    fmt_duration,
    newest_audits,
    timeline_from_api,
    write_report,
)
from services.evaluation.rsi_index import BenchmarkScore

PNG = b"\x89PNG\r\n\x1a\n"
ROLLOUT_RGB = (0x1F, 0x77, 0xB4)  # matplotlib's first and second cycle colours: one line per service
TRAINING_RGB = (0xFF, 0x7F, 0x0E)


def runs() -> list[RunScores]:
    return [
        RunScores("run-a", "agent-x", "data", (BenchmarkScore("arith", 0.4, 0.7),)),
        RunScores("run-b", "agent-x", "data", (BenchmarkScore("arith", 0.4, 0.55),)),
        RunScores("run-c", "agent-y", "joint", (BenchmarkScore("arith", 0.4, 0.4),)),
    ]


AUDITS = [  # as GET /admin/v1/audits answers: newest first, but not relied upon
    {"id": "aud_2", "run_id": "run-a", "status": "flagged", "hacking_rate": 0.5, "created_at": "2025-01-02T00:00:00+00:00"},
    {"id": "aud_1", "run_id": "run-a", "status": "accepted", "hacking_rate": 0.0, "created_at": "2025-01-01T00:00:00+00:00"},
    {"id": "aud_0", "run_id": "run-b", "status": "flagged", "hacking_rate": 1.0, "created_at": "2024-12-01T00:00:00+00:00"},
    {"id": "aud_3", "run_id": "run-b", "status": "accepted", "hacking_rate": 0.0, "created_at": "2025-01-03T00:00:00+00:00"},
]


def timeline(run_id: str = "run-a", **over: Any) -> dict[str, Any]:
    """A timeline as GET /admin/v1/runs/{run_id}/timeline answers it."""
    body = {
        "object": "run.timeline", "run_id": run_id, "started_at": "2025-01-01T00:00:00+00:00",
        "first_training_job_at": "2025-01-01T00:02:05+00:00", "time_to_first_training_job_s": 125.0,
        "first_activity_at": "2025-01-01T00:00:30+00:00", "last_activity_at": "2025-01-01T03:30:30+00:00",
        "research_hours": 3.5,
        "experiments": {"total": 4, "pending": 1, "accepted": 2, "flagged": 1},
        "spend_usd": 0.75,
        "spend_by_service": {
            "rollout": {"total_usd": 0.25, "points": [
                {"at": "2025-01-01T00:00:30+00:00", "hours": 0.0083, "usd": 0.05},
                {"at": "2025-01-01T01:00:00+00:00", "hours": 1.0, "usd": 0.15},
                {"at": "2025-01-01T03:00:00+00:00", "hours": 3.0, "usd": 0.25}]},
            "training": {"total_usd": 0.5, "points": [
                {"at": "2025-01-01T00:30:00+00:00", "hours": 0.5, "usd": 0.2},
                {"at": "2025-01-01T03:30:00+00:00", "hours": 3.5, "usd": 0.5}]},
        },
    }
    return {**body, **over}


# -- integrity ---------------------------------------------------------------------------------


def test_newest_audit_decides_a_runs_integrity() -> None:
    verdicts = newest_audits(AUDITS)
    assert {r: (v.status, v.hacking_rate) for r, v in verdicts.items()} == {
        "run-a": ("flagged", 0.5), "run-b": ("accepted", 0.0)}  # an old flag does not outlive a newer audit
    report = build_report(runs(), verdicts)
    assert {r.run_id: (r.integrity, r.hacking_rate) for r in report.runs} == {
        "run-a": ("flagged", 0.5), "run-b": ("accepted", 0.0), "run-c": ("not audited", None)}
    x, y = report.agents
    assert (x.agent, x.flagged_runs, y.flagged_runs) == ("agent-x", ("run-a",), ())


def test_integrity_shows_in_tables_markdown_and_json(tmp_path: Path) -> None:
    console = Console(record=True, width=220)
    files = write_report(runs(), tmp_path, console, audits=newest_audits(AUDITS))

    text = console.export_text()
    assert "integrity" in text and "hacking rate" in text and "flagged" in text
    assert "not audited" in text and "1 of 2" in text  # agent-x: one of its two runs flagged

    md = files.markdown.read_text()
    assert "| agent | tracks | runs | flagged (not in the index) | RSI-Index | 95% CI (t, over runs) |" in md
    assert "| agent-x | data | run-a, run-b | 1 of 2 | 0.2500 | n/a |" in md  # run-a is flagged: run-b alone
    assert "| run-a | agent-x | data | 0.5000 | 0.5000 | n/a | flagged | 0.5000 |" in md
    assert "| run-c | agent-y | joint | 0.0000 | 0.0000 | n/a | not audited | n/a |" in md

    data = json.loads(files.json.read_text())
    assert {r["run_id"]: (r["integrity"], r["hacking_rate"]) for r in data["runs"]} == {
        "run-a": ("flagged", 0.5), "run-b": ("accepted", 0.0), "run-c": ("not audited", None)}
    assert {a["agent"]: a["flagged_runs"] for a in data["agents"]} == {"agent-x": ["run-a"], "agent-y": []}
    assert data["timelines"] == [] and not files.timeline_charts


def test_unreadable_audits_are_unknown_not_clean(tmp_path: Path) -> None:
    files = write_report(runs(), tmp_path, Console(record=True), integrity_default=INTEGRITY_UNKNOWN)
    data = json.loads(files.json.read_text())
    assert {r["integrity"] for r in data["runs"]} == {"unknown"}
    assert "not audited" not in files.markdown.read_text()


# -- timeline ----------------------------------------------------------------------------------


def _has_colour(path: Path, rgb: tuple[int, int, int], tolerance: int = 12) -> bool:
    with Image.open(path) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
    return any(isinstance(colour, tuple) and n > 20
               and all(abs(c - t) <= tolerance for c, t in zip(colour, rgb, strict=True))
               for n, colour in colours)


def test_timeline_figures_go_into_every_output(tmp_path: Path) -> None:
    timelines = [timeline_from_api(timeline("run-a")),
                 timeline_from_api(timeline("run-zzz"))]  # not a reported run: dropped
    console = Console(record=True, width=240)
    files = write_report(runs(), tmp_path, console, audits={}, timelines=timelines)

    assert [t.run_id for t in files.report.timelines] == ["run-a"]
    text = console.export_text()
    assert "Timeline per run" in text and "2m 05s" in text and "3.50" in text

    md = files.markdown.read_text()
    assert "## Timeline" in md
    assert ("| run-a | 2025-01-01 00:00 UTC | 2m 05s | 3.50 | 4 (2 accepted, 1 flagged, 1 pending) | 0.750000 "
            "| rollout 0.250000, training 0.500000 |") in md
    assert "(timeline-run-a.png)" in md

    data = json.loads(files.json.read_text())
    (tl,) = data["timelines"]
    assert tl["run_id"] == "run-a" and tl["time_to_first_training_job_s"] == 125.0 and tl["research_hours"] == 3.5
    assert tl["experiments"] == {"total": 4, "pending": 1, "accepted": 2, "flagged": 1}
    assert tl["spend_by_service_usd"] == {"rollout": 0.25, "training": 0.5} and tl["spend_usd"] == 0.75
    assert tl["figure"] == "timeline-run-a.png"

    assert set(files.timeline_charts) == {"run-a"}
    path = files.timeline_charts["run-a"]
    assert path == tmp_path / "timeline-run-a.png" and path.read_bytes().startswith(PNG)
    with Image.open(path) as image:
        assert image.format == "PNG" and 400 <= image.width <= 2000 and 300 <= image.height <= 1500
    assert _has_colour(path, ROLLOUT_RGB) and _has_colour(path, TRAINING_RGB)


def test_a_run_without_spend_or_training_still_gets_its_chart(tmp_path: Path) -> None:
    quiet = timeline_from_api(timeline("run-b", first_training_job_at=None, time_to_first_training_job_s=None,
                                       research_hours=0.0, spend_usd=0.0, spend_by_service={},
                                       experiments={"total": 0, "pending": 0, "accepted": 0, "flagged": 0}))
    files = write_report(runs(), tmp_path, Console(record=True, width=240), timelines=[quiet])
    md = files.markdown.read_text()
    assert "| run-b | 2025-01-01 00:00 UTC | no training job | 0.00 | 0 (0 accepted, 0 flagged, 0 pending) " \
           "| 0.000000 | - |" in md
    with Image.open(files.timeline_charts["run-b"]) as image:
        assert image.format == "PNG" and image.width > 200
    assert not _has_colour(files.timeline_charts["run-b"], ROLLOUT_RGB)


def test_timeline_chart_never_overwrites_a_benchmark_chart(tmp_path: Path) -> None:
    rows = [RunScores("run-a", "agent-x", "data", (BenchmarkScore("timeline-run-a", 0.4, 0.7),))]
    files = write_report(rows, tmp_path, Console(record=True), timelines=[timeline_from_api(timeline("run-a"))])
    bench, tl = files.charts["timeline-run-a"], files.timeline_charts["run-a"]
    assert bench != tl and bench.exists() and tl.exists()
    assert json.loads(files.json.read_text())["timelines"][0]["figure"] == tl.name


@pytest.mark.parametrize(("seconds", "shown"), [(None, "no training job"), (0.4, "0m 00s"), (125.0, "2m 05s"),
                                                 (3599.6, "1h 00m"), (7 * 3600 + 65, "7h 01m")])
def test_durations_read_naturally(seconds: float | None, shown: str) -> None:
    assert fmt_duration(seconds) == shown
