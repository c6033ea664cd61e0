"""The papers' analyses (ops/analyses/): Cohen's kappa against a textbook value, the best-so-far
curve, tool categories, hacking incidence on seeded audits, and a blind labelling export that
holds no run id and no verdict."""

from __future__ import annotations

import csv
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kit.errors import Unprocessable
from ops.analyses import best_so_far, build, labels, tool_use
from ops.analyses.agreement import cohen_kappa
from ops.analyses.incidence import incidence
from services.records.audits.taxonomy import CATEGORY_IDS, CODES

START = datetime(2026, 1, 1, tzinfo=UTC)


def at(hours: float) -> str:
    return (START + timedelta(hours=hours)).isoformat()


def test_cohen_kappa_matches_the_textbook_example() -> None:
    """Wikipedia's "Cohen's kappa" example: 50 proposals, both yes 20, A yes B no 5, A no B yes 10,
    both no 15: po = 0.7, pe = 0.5, kappa = 0.4."""
    a = ["yes"] * 20 + ["yes"] * 5 + ["no"] * 10 + ["no"] * 15
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    k = cohen_kappa(a, b)
    assert k["observed"] == pytest.approx(0.7) and k["expected"] == pytest.approx(0.5)
    assert k["kappa"] == pytest.approx(0.4) and k["n"] == 50
    assert cohen_kappa(["x", "y", "x"], ["x", "y", "x"])["kappa"] == pytest.approx(1.0)
    assert cohen_kappa(["x", "x"], ["x", "x"])["kappa"] is None  # pe = 1: undefined, not 0 or 1
    assert cohen_kappa([], [])["kappa"] is None


def evaluation(hours: float, score: float | None, *, status: str = "succeeded", benchmark: str = "arith",
               split: str = "dev") -> dict[str, Any]:
    return {"kind": "evaluation.job", "created_at": at(hours),
            "data": {"job_id": f"job-{hours}", "status": status, "score": score, "benchmark": benchmark, "split": split}}


def test_best_so_far_never_falls_and_keeps_benchmarks_apart() -> None:
    rng = random.Random(3)
    events = [evaluation(h / 4, rng.random()) for h in range(40)]
    events += [evaluation(1.0, None, status="failed"), evaluation(2.0, 0.99, benchmark="other"),
               {"kind": "training.job", "created_at": at(0.5), "data": {"status": "succeeded", "score": 1.0}}]
    curve = best_so_far.curve(list(reversed(events)), START)  # read in any order: sorted by time
    assert set(curve) == {"arith/dev", "other/dev"}
    points = curve["arith/dev"]
    assert len(points) == 40 and [p["hours"] for p in points] == sorted(p["hours"] for p in points)
    best = [p["best"] for p in points]
    assert best == sorted(best) and best[-1] == max(p["score"] for p in points)
    assert all(p["best"] == max(q["score"] for q in points[: i + 1]) for i, p in enumerate(points))


@pytest.mark.parametrize(("name", "arguments", "expected"), [
    ("mcp__gym__execution_start_training", None, "training"),
    ("data_upload_dataset", None, "training"),
    ("mcp__gym__evidence_best_checkpoint", None, "records"),
    ("execution_start_evaluation", None, "evaluation"),
    ("execution_submit", None, "evaluation"),
    ("execution_chat", None, "inference"),
    ("mcp__gym__execution_sandbox_exec", None, "sandbox"),
    ("review_record_review", None, "records"),
    ("Bash", {"command": "gym training jobs list"}, "training"),
    ("shell", {"command": ["curl", "$RSIGYM_URL/rollout/v1/chat/completions"]}, "inference"),
    ("Read", {"file_path": "/home/agent/notes.md"}, "local"),
    ("something_else", None, "other"),
])
def test_tool_calls_fall_in_categories(name: str, arguments: Any, expected: str) -> None:
    assert tool_use.category(name, arguments) == expected


def test_tool_use_counts_calls_per_bin() -> None:
    turns = [{"created_at": at(0.1), "response": {"tool_calls": [{"name": "execution_start_training"},
                                                                  {"name": "Bash", "arguments": "ls"}]}},
             {"created_at": at(0.9), "response": {"tool_calls": [{"name": "execution_start_evaluation"}]}},
             {"created_at": at(0.5), "response": {"text": "thinking", "tool_calls": []}}]
    ledger = [{"created_at": at(0.2), "service": "training"}, {"created_at": at(1.0), "service": "evaluation"}]
    use = tool_use.tool_use(turns, ledger, START, bins=2)
    agent = use["agent_tools"]
    assert agent["totals"] == {"evaluation": 1, "local": 1, "training": 1}
    assert agent["counts"]["training"] == [1, 0] and agent["counts"]["evaluation"] == [0, 1]
    assert agent["bin_hours"] == pytest.approx(0.5)  # one time axis: the ledger's last row is the later
    assert use["platform_calls"]["counts"] == {"evaluation": [0, 1], "training": [1, 0]}


def audit(run: str, codes: dict[str, str], *, when: str = "2026-01-02T00:00:00+00:00",
          evidence: dict[str, str] | None = None) -> dict[str, Any]:
    categories = {c: codes.get(c, "NOT_OBSERVED") for c in CATEGORY_IDS}
    findings = [{"category": c, "code": code, "task_ids": [],
                 "evidence": (evidence or {}).get(c, f"{run} did {c} with job_0123456789abcdef01234567")}
                for c, code in codes.items()]
    return {"id": f"aud_{run}", "run_id": run, "status": "flagged" if "EXECUTED" in codes.values() else "accepted",
            "created_at": when, "report": {"categories": categories,
                                           "checks": [{"name": "behaviour", "verdict": "pass", "findings": findings},
                                                      {"name": "contamination", "verdict": "pass", "findings": []}]}}


def seeded_audits() -> list[dict[str, Any]]:
    return [audit("key_aaaaaaaaaaaaaaaaaaaaaaaa", {"test_set_contamination": "EXECUTED"}),
            audit("key_aaaaaaaaaaaaaaaaaaaaaaaa", {}, when="2025-12-31T00:00:00+00:00"),  # older: not counted
            audit("key_bbbbbbbbbbbbbbbbbbbbbbbb", {"test_set_contamination": "ATTEMPTED_BLOCKED",
                                                   "credential_use": "EXECUTED"}),
            audit("key_cccccccccccccccccccccccc", {"credential_use": "SUSPECTED"}),
            audit("key_dddddddddddddddddddddddd", {})]


def test_incidence_is_the_fraction_of_audited_runs_per_category() -> None:
    result = incidence(seeded_audits())
    assert result["runs"] == 4
    rows = {r["id"]: r for r in result["categories"]}
    assert [r["id"] for r in result["categories"]] == list(CATEGORY_IDS)
    assert rows["test_set_contamination"]["executed"] == pytest.approx(0.25)
    assert rows["test_set_contamination"]["attempted"] == pytest.approx(0.25)
    assert rows["credential_use"]["executed"] == pytest.approx(0.25)
    assert rows["credential_use"]["attempted"] == 0.0  # SUSPECTED is neither
    assert rows["reward_manipulation"]["executed"] == 0.0
    only = incidence(seeded_audits(), {"key_dddddddddddddddddddddddd"})
    assert only["runs"] == 1 and all(r["executed"] == 0.0 for r in only["categories"])


def test_the_labelling_export_holds_no_run_id_and_no_verdict(tmp_path: Path) -> None:
    audits = seeded_audits()
    result = labels.export(audits, tmp_path)
    assert result == {"items": 4, "runs": 3, "dir": str(tmp_path)}
    shown = (tmp_path / labels.ITEMS).read_text() + (tmp_path / labels.TEMPLATE).read_text()
    for run in {a["run_id"] for a in audits}:
        assert run not in shown
    assert "job_0123456789abcdef01234567" not in shown and "aud_" not in shown
    items = [json.loads(line) for line in (tmp_path / labels.ITEMS).read_text().splitlines()]
    for item in items:
        assert set(item) == {"item", "run", "category", "stage", "title", "definition", "evidence"}
        assert not any(code in json.dumps(item) for code in CODES)
        assert item["evidence"][0].startswith(item["run"])  # the run's own id in the evidence: its anonymous id
    assert (tmp_path / labels.KEY).stat().st_mode & 0o077 == 0
    again = labels.export(audits, tmp_path)  # a second export keeps the anonymous ids
    assert again["items"] == 4
    assert {i["item"]: i["run"] for i in items} == {json.loads(line)["item"]: json.loads(line)["run"]
                                                  for line in (tmp_path / labels.ITEMS).read_text().splitlines()}


def test_two_labellers_kappa_with_each_other_and_the_judge(tmp_path: Path) -> None:
    labels.export(seeded_audits(), tmp_path)
    key = json.loads((tmp_path / labels.KEY).read_text())["items"]
    rows = list(csv.DictReader((tmp_path / labels.TEMPLATE).open()))
    one = tmp_path / "one.csv"
    with one.open("w", newline="") as f:  # labeller one agrees with the judge
        w = csv.writer(f)
        w.writerow(["item", "run", "category", "label"])
        w.writerows([r["item"], r["run"], r["category"], key[r["item"]]["judge"].lower()] for r in rows)
    two = tmp_path / "two.jsonl"  # labeller two calls everything EXECUTED but one item unlabelled
    two.write_text("".join(json.dumps({"item": r["item"], "label": "EXECUTED"}) + "\n" for r in rows[1:]))
    assert labels.import_labels(tmp_path, "one", one)["labelled"] == 4
    assert labels.import_labels(tmp_path, "two", two)["labelled"] == 3
    result = labels.kappa(tmp_path)
    judge_one = next(r for r in result["vs_judge"] if r["labeller"] == "one")
    assert judge_one["codes"]["kappa"] == pytest.approx(1.0) and judge_one["codes"]["n"] == 4
    [pair] = result["pairs"]
    assert (pair["a"], pair["b"], pair["codes"]["n"]) == ("one", "two", 3)
    bad = tmp_path / "bad.csv"
    bad.write_text("item,label\nitem-nope,EXECUTED\n")
    with pytest.raises(Unprocessable):
        labels.import_labels(tmp_path, "three", bad)
    bad.write_text(f"item,label\n{rows[0]['item']},GUILTY\n")
    with pytest.raises(Unprocessable):
        labels.import_labels(tmp_path, "three", bad)
    with pytest.raises(Unprocessable):
        labels.import_labels(tmp_path, "../x", one)


def test_the_analyses_files_are_written(tmp_path: Path) -> None:
    labels.export(seeded_audits(), tmp_path / "labels")
    data = {"runs": {"key_aaaaaaaaaaaaaaaaaaaaaaaa": {
        "started_at": START.isoformat(), "agent": "baseline", "task": "t",
        "best_so_far": best_so_far.curve([evaluation(0.5, 0.2), evaluation(1.0, 0.4)], START),
        "tool_use": tool_use.tool_use([], [{"created_at": at(0.3), "service": "training"}], START)}},
        "hacking_incidence": incidence(seeded_audits()), "notes": []}
    written = build.write(data, tmp_path)
    names = {p.name for p in written.files}
    assert {"analyses.json", "analyses.md", "hacking-incidence.png", "best-so-far-key_aaaaaaaaaaaaaaaaaaaaaaaa.png",
            "tool-use-key_aaaaaaaaaaaaaaaaaaaaaaaa.png"} <= names
    assert all(p.stat().st_size > 0 for p in written.files)
    saved = json.loads((tmp_path / "analyses.json").read_text())
    assert saved["labels"]["items"] == 4 and saved["labels"]["pairs"] == []
    md = (tmp_path / "analyses.md").read_text()
    assert "| key_aaaaaaaaaaaaaaaaaaaaaaaa | arith/dev | 2 | 0.200 | 0.400 | 1.00 |" in md
    assert "## Hacking incidence per category (4 audited runs)" in md and "## Blind labelling (4 items)" in md


def test_run_ids_are_root_run_keys_not_agent_meters() -> None:
    keys = [{"id": "key_a", "parent_id": None, "run_id": "key_a", "agent_meter_id": "key_m"},
            {"id": "key_m", "parent_id": None, "run_id": "key_m", "agent_meter_id": None},
            {"id": "key_c", "parent_id": "key_a", "run_id": "key_a", "agent_meter_id": None}]
    assert build.run_ids(keys) == ["key_a"]
