"""The operator's evaluation commands (`rsigym benchmarks …`, `rsigym score`, `rsigym report`)
against a real embedded gym served on loopback.

The report tests fill the scores table through the store (finished jobs and their score
records, as scoring leaves them), so no trial has to run; one test registers a two-task
benchmark and scores a run for real, with bubblewrap sandboxes and the tiny model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kit.ids import new_id
from kit.settings import StoreSettings
from ops.cli.main import app as operator_cli
from ops.cli.scoring import watched_records
from rsigym import Gym
from services.evaluation.report import build_report_rows
from services.evaluation.tables import EvaluationJob, ScoreRow, TrialResultRow
from services.records.tables import AuditRow
from storage.store import Store, sqlite_url
from tests.conftest import ADMIN_TOKEN, create_key
from tests.fakes.servers import serve_gym

ROOT = Path(__file__).resolve().parents[3]
PNG = b"\x89PNG\r\n\x1a\n"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(sqlite_url(tmp_path / "db"), StoreSettings())
    s.migrate()
    yield s
    s.dispose()


@pytest.fixture
def served(make_gym: Callable[..., Any], store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    gym = make_gym(store=store)
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield url
    gym.service_apps["evaluation"].state.evaluation.runner.wait_idle(timeout=120)


def rsigym(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args and code == 0 else result


def new_key(url: str, track: str, name: str) -> dict[str, Any]:
    with httpx.Client(base_url=url) as c:
        return create_key(c, track=track, name=name, budget_usd=5.0)


def add_score(store: Store, run_id: str, benchmark: str, score: float | None, *, status: str = "succeeded",
              model: str = "tiny", harness: str = "minimal", attempts: int = 3, split: str = "official",
              minutes: int = 0, agent: str | None = None, submission_id: str | None = None) -> str:
    """A finished (or not) scoring job and its score record, as `rsigym score` leaves them; its job id."""
    job_id = new_id("evj")
    at = T0 + timedelta(minutes=minutes)
    with store.transaction() as s:
        s.add(EvaluationJob(id=job_id, run_id=run_id if run_id != "initial" else "operator", key_id="k", benchmark=benchmark,
                            purpose="baseline" if run_id == "initial" else "score", split=split, model=model,
                            harness=harness, attempts=attempts, sampling={}, task_ids=["t1", "t2"],
                            gateway_url="http://x", status=status, trials_total=2 * attempts,
                            trials_done=2 * attempts if status == "succeeded" else 1, score=score, created_at=at))
        s.add(ScoreRow(id=new_id("scr"), run_id=run_id, submission_id=submission_id, benchmark=benchmark, split=split,
                       model=model, harness=harness, attempts=attempts, job_id=job_id, score=score, status=status,
                       agent=agent, created_at=at))
    return job_id


def add_trials(store: Store, job_id: str, rewards: dict[str, list[float]]) -> None:
    """The job's trials (task → the rewards of its attempts), as its workers record them."""
    with store.transaction() as s:
        for task, attempts in rewards.items():
            for attempt, reward in enumerate(attempts):
                s.add(TrialResultRow(job_id=job_id, task_id=task, attempt=attempt, reward=reward, trajectory=None))


def scored_with_trials(store: Store, run_id: str, benchmark: str, rewards: dict[str, list[float]],
                       **kw: Any) -> str:
    """A succeeded score whose value is its trials' avg@k, with those trials."""
    score = sum(sum(r) / len(r) for r in rewards.values()) / len(rewards)
    job_id = add_score(store, run_id, benchmark, score, attempts=len(next(iter(rewards.values()))), **kw)
    add_trials(store, job_id, rewards)
    return job_id


def fill_scores(store: Store, run_a: str, run_b: str, run_c: str) -> None:
    add_score(store, "initial", "arithmetic", 0.2, minutes=0)          # superseded by the newer baseline
    add_score(store, "initial", "arithmetic", 0.4, minutes=5)
    add_score(store, "initial", "arithmetic", 0.9, attempts=1, minutes=6)  # another avg@k: not comparable
    add_score(store, "initial", "shell", 1.0, minutes=5)                # no headroom
    add_score(store, run_a, "arithmetic", 0.5, model="ckpt_a", minutes=6)  # superseded by the rescore below
    add_score(store, run_a, "arithmetic", 0.7, model="ckpt_a", minutes=10)
    add_score(store, run_a, "shell", 1.0, model="ckpt_a", minutes=10)
    add_score(store, run_b, "arithmetic", 0.55, harness="hrn_b", minutes=11, agent="agent-b")
    add_score(store, run_b, "shell", None, harness="hrn_b", status="failed", minutes=11, agent="agent-b")
    add_score(store, run_c, "arithmetic", None, status="running", minutes=12)


# ---- report --------------------------------------------------------------------------------


def test_report_writes_tables_markdown_json_and_charts(served: str, store: Store, tmp_path: Path) -> None:
    a, b, c = (new_key(served, t, n)["id"] for t, n in (("data", "agent-a"), ("harness", "agent-b"), ("joint", "c")))
    fill_scores(store, a, b, c)
    with store.transaction() as s:  # audits as `rsigym audit` stores them: the newest one counts
        s.add(AuditRow(id="aud_old", run_id=a, status="accepted", hacking_rate=0.0, report={}, created_at=T0))
        s.add(AuditRow(id="aud_new", run_id=a, status="flagged", hacking_rate=0.5, report={},
                       created_at=T0 + timedelta(hours=1)))
    out = tmp_path / "report"

    result = rsigym("report", "--out", str(out))
    assert "RSI-Index per agent" in result.stdout and "agent-a" in result.stdout and "0.5000" in result.stdout
    assert "still being scored" in result.stderr and c in result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["arithmetic.png", "report.json", "report.md", "shell.png", f"timeline-{a}.png", f"timeline-{b}.png",
         # the papers' analyses of its runs (ops/analyses/, issue 57)
         "analyses.json", "analyses.md", "hacking-incidence.png",
         *(f"{chart}-{run}.png" for chart in ("best-so-far", "tool-use") for run in (a, b))])
    assert all((out / n).read_bytes().startswith(PNG)
               for n in ("arithmetic.png", "shell.png", f"timeline-{a}.png", f"timeline-{b}.png"))
    md = (out / "report.md").read_text()
    assert "# RSI-Index report" in md and f"| {a} | agent-a | data |" in md and "no headroom" in md

    data = json.loads((out / "report.json").read_text())
    runs = {r["run_id"]: r for r in data["runs"]}
    assert set(runs) == {a, b}
    assert runs[a]["track"] == "data" and runs[a]["agent"] == "agent-a"
    assert (runs[a]["integrity"], runs[a]["hacking_rate"]) == ("flagged", 0.5)
    assert (runs[b]["integrity"], runs[b]["hacking_rate"]) == ("not audited", None)
    assert [t["run_id"] for t in data["timelines"]] == [a, b] and data["timelines"][0]["spend_usd"] == 0
    assert runs[a]["rsi_index"] == pytest.approx((0.7 - 0.4) / 0.6)  # the newest score and baseline
    assert runs[a]["excluded"] == [{"benchmark": "shell", "reason": "initial score already 1: no headroom"}]
    assert runs[b]["track"] == "harness" and [t["benchmark"] for t in runs[b]["benchmarks"]] == ["arithmetic"]
    assert runs[b]["rsi_index"] == pytest.approx((0.55 - 0.4) / 0.6)
    assert {x["agent"]: x["rsi_index"] for x in data["agents"]} == {"agent-a": None,  # its one run is flagged
                                                                   "agent-b": pytest.approx(0.25)}
    assert {x["agent"]: x["flagged_runs"] for x in data["agents"]} == {"agent-a": [a], "agent-b": []}

    printed = rsigym("report", "--out", str(tmp_path / "again"), "--json")
    assert printed == data


def test_report_with_nothing_scored_says_so(served: str, store: Store, tmp_path: Path) -> None:
    run = new_key(served, "data", "lonely")["id"]
    add_score(store, run, "arithmetic", 0.7)  # no baseline yet
    result = rsigym("report", "--out", str(tmp_path / "r"), code=1)
    assert "no initial-system score" in result.stderr and "rsigym score RUN --wait" in result.stderr
    assert not (tmp_path / "r").exists()


def test_report_rows_match_the_baseline_on_benchmark_split_and_attempts() -> None:
    def rec(run: str, bench: str, score: float | None, at: str, **kw: Any) -> dict[str, Any]:
        return {"id": new_id("scr"), "run_id": run, "benchmark": bench, "split": kw.get("split", "official"),
                "attempts": kw.get("attempts", 3), "model": kw.get("model", "tiny"), "agent": kw.get("agent"),
                "score": score, "status": kw.get("status", "succeeded"), "created_at": at}

    scores = [
        rec("initial", "arith", 0.1, "2025-01-01T00:00", model="small"),
        rec("initial", "arith", 0.3, "2025-01-01T00:01", model="tiny"),
        rec("initial", "arith", 0.2, "2025-01-01T00:02", model="other"),   # newest, another base model
        rec("initial", "arith", 0.5, "2025-01-01T00:03", split="dev"),
        rec("r1", "arith", 0.8, "2025-01-01T01:00", model="tiny", agent="alice"),   # kept its base: 0.3
        rec("r2", "arith", 0.6, "2025-01-01T01:00", model="ckpt_x"),                # a checkpoint: newest, 0.2
        rec("r3", "arith", 0.6, "2025-01-01T01:00", attempts=1),                    # no avg@1 baseline
    ]
    keys = [{"id": "r1", "track": "harness", "name": "key-1"}, {"id": "r2", "track": "data", "name": "key-2"}]
    rows, notes = build_report_rows(scores, keys)
    assert [(r.run_id, r.agent, r.track, r.initial, r.submitted) for r in rows] == [
        ("r1", "alice", "harness", 0.3, 0.8), ("r2", "key-2", "data", 0.2, 0.6)]
    assert len(notes) == 1 and "r3" in notes[0] and "avg@1" in notes[0]
    dev_rows, _ = build_report_rows(scores + [rec("r1", "arith", 0.9, "2025-01-01T02:00", split="dev")], keys, "dev")
    assert [(r.run_id, r.initial, r.submitted) for r in dev_rows] == [("r1", 0.5, 0.9)]


def test_score_waits_for_the_cached_baseline_too() -> None:
    started = [{"id": "s2", "run_id": "r", "benchmark": "b", "split": "official", "attempts": 3}]
    scores = [
        {"id": "s1", "run_id": "initial", "benchmark": "b", "split": "official", "attempts": 3},
        {"id": "s0", "run_id": "initial", "benchmark": "b", "split": "official", "attempts": 1},
        {"id": "s9", "run_id": "r", "benchmark": "b", "split": "official", "attempts": 3},  # an earlier scoring
        *started,
    ]
    assert [r["id"] for r in watched_records(started, scores, "r")] == ["s1", "s2"]


# ---- benchmarks and scoring, for real ------------------------------------------------------


def tiny_benchmark(tmp_path: Path) -> Path:
    """The bundled arithmetic benchmark cut down to one task per split (the official one drawn at registration)."""
    src, dest = ROOT / "benchmarks" / "arithmetic", tmp_path / "tiny-arithmetic"
    shutil.copytree(src, dest)
    for task in sorted((dest / "dev").iterdir())[1:]:
        shutil.rmtree(task)
    toml = dest / "benchmark.toml"
    toml.write_text(toml.read_text().replace('name = "arithmetic"', 'name = "tiny-arithmetic"')
                    .replace("count = 60", "count = 1"))
    return dest


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_register_score_and_report(served: str, tmp_path: Path) -> None:
    registered = rsigym("benchmarks", "register", str(tiny_benchmark(tmp_path)), "--wait", "--json")
    assert registered["name"] == "tiny-arithmetic" and registered["status"] == "ready", registered
    assert registered["validation"]["oracle_scored_1"] == 2 and registered["validation"]["empty_scored_0"] == 2
    listed = rsigym("benchmarks", "list", "--json")["data"]
    assert [b["name"] for b in listed] == ["tiny-arithmetic"] and listed[0]["splits"]["official"]["hidden"]
    assert listed[0]["splits"]["official"]["generated"]["seed"] == "gym"  # drawn at registration
    assert "ready" in rsigym("benchmarks", "list").stdout
    again = rsigym("benchmarks", "register", str(tiny_benchmark(tmp_path / "x")), code=1)
    assert "already registered" in again.output

    run = new_key(served, "harness", "agent-h")
    assert "submitted nothing" in rsigym("score", run["id"], code=1).output
    with Gym(base_url=served, api_key=run["key"], max_retries=0) as gym:
        harness = gym.evaluation.upload_harness(ROOT / "agent_container" / "harness" / "minimal")
        gym.submit(harness=harness.id)

    printed = rsigym("score", run["id"], "--attempts", "1", "--wait", "--json")
    scored = printed["data"]
    (vs_initial,) = printed["comparisons"]  # the submission vs the initial system, with its interval
    assert vs_initial["benchmark"] == "tiny-arithmetic" and vs_initial["tasks"] == 1 and vs_initial["seed"] == 57
    assert vs_initial["within_noise"] == (vs_initial["ci95"][0] <= 0 <= vs_initial["ci95"][1])
    assert sorted(r["run_id"] for r in scored) == sorted(["initial", run["id"]])
    assert all(r["status"] == "succeeded" and 0.0 <= r["score"] <= 1.0 for r in scored), scored
    assert all(r["progress"] == {"done": 1, "total": 1} for r in scored)
    rescored = rsigym("score", run["id"], "--attempts", "1", "--wait", "--json")["data"]
    assert sorted(r["run_id"] for r in rescored) == sorted(["initial", run["id"]])  # the cached baseline, watched
    initial = next(r for r in scored if r["run_id"] == "initial")
    assert next(r for r in rescored if r["run_id"] == "initial")["id"] == initial["id"]

    report = rsigym("report", "--out", str(tmp_path / "report"), "--json")
    (row,) = report["runs"]
    assert row["run_id"] == run["id"] and row["agent"] == "agent-h" and row["track"] == "harness"
    assert row["benchmarks"][0]["benchmark"] == "tiny-arithmetic"
    assert row["benchmarks"][0]["comparison"]["diff"] == pytest.approx(vs_initial["diff"])
    assert row["benchmarks"][0]["pass_at_k"]["submitted"].keys() == {"pass@1", "solved_all@1"}
    assert (tmp_path / "report" / "tiny-arithmetic.png").read_bytes().startswith(PNG)


def test_report_groups_runs_of_one_task_by_the_agent_recorded_on_their_keys(
        served: str, store: Store, tmp_path: Path) -> None:
    """`rsigym run start` names run keys after the task: two agents' runs of one task share a key
    name, and the report tells them apart by the agent the launcher recorded."""
    with httpx.Client(base_url=served) as c:
        runs = {agent: create_key(c, track="joint", name="joint-arithmetic", budget_usd=5.0,
                                  run={"task": "joint-arithmetic", "agent": agent, "agent_version": "1.0"})["id"]
                for agent in ("baseline", "scripted")}
    add_score(store, "initial", "arithmetic", 0.4)
    add_score(store, runs["baseline"], "arithmetic", 0.7, model="ckpt_b", minutes=1)  # scored before agents were recorded
    add_score(store, runs["scripted"], "arithmetic", 0.4, model="ckpt_s", minutes=1)

    data = rsigym("report", "--out", str(tmp_path / "report"), "--json")
    assert {r["run_id"]: r["agent"] for r in data["runs"]} == {runs["baseline"]: "baseline@1.0",
                                                               runs["scripted"]: "scripted@1.0"}
    assert {a["agent"]: a["rsi_index"] for a in data["agents"]} == pytest.approx({"baseline@1.0": 0.5,
                                                                                  "scripted@1.0": 0.0})


def test_two_versions_of_one_agent_are_two_agents_on_the_leaderboard(
        served: str, store: Store, tmp_path: Path) -> None:
    with httpx.Client(base_url=served) as c:
        runs = {version: create_key(c, track="joint", name="joint-arithmetic", budget_usd=5.0,
                                    run={"task": "joint-arithmetic", "agent": "claude-code",
                                         "agent_version": version})["id"]
                for version in ("2.0.14", "2.1.0")}
    add_score(store, "initial", "arithmetic", 0.4)
    add_score(store, runs["2.0.14"], "arithmetic", 0.7, model="ckpt_a", minutes=1)
    add_score(store, runs["2.1.0"], "arithmetic", 0.4, model="ckpt_b", minutes=1)
    data = rsigym("report", "--out", str(tmp_path / "report"), "--json")
    assert {a["agent"]: a["rsi_index"] for a in data["agents"]} == pytest.approx({"claude-code@2.0.14": 0.5,
                                                                                  "claude-code@2.1.0": 0.0})


# ---- intervals and honest aggregates --------------------------------------------------------


def test_report_gives_every_comparison_its_interval(served: str, store: Store, tmp_path: Path) -> None:
    """A clear gain on 40 tasks is beyond noise, a run equal to the initial system within it; the
    index, its terms, dev vs official and pass@k are in report.json and report.md."""
    with httpx.Client(base_url=served) as c:
        gain, same = (create_key(c, track="joint", name=n, budget_usd=5.0, run={"task": "joint-arith", "agent": n})["id"]
                      for n in ("gainer", "idler"))
    initial = {f"t{i:02d}": [1.0, 0.0, 0.0] if i % 2 else [0.0, 0.0, 0.0] for i in range(40)}
    better = {t: [1.0, 1.0, 1.0] if i % 4 else [1.0, 0.0, 1.0] for i, t in enumerate(initial)}
    scored_with_trials(store, "initial", "arithmetic", initial)
    scored_with_trials(store, gain, "arithmetic", better, model="ckpt_g", minutes=1, submission_id="sub_g")
    scored_with_trials(store, gain, "arithmetic", {f"d{i}": [1.0, 1.0, 0.0] for i in range(10)}, model="ckpt_g",
                       split="dev", minutes=1, submission_id="sub_g")
    scored_with_trials(store, same, "arithmetic", initial, minutes=1)

    data = rsigym("report", "--out", str(tmp_path / "report"), "--json")
    runs = {r["run_id"]: r for r in data["runs"]}
    assert data["bootstrap"]["resamples"] == 2000 and data["bootstrap"]["seed"] == 57
    g, i = runs[gain], runs[same]
    assert g["ci95"][0] > 0 and g["within_noise"] is False
    assert g["ci95"][0] < g["rsi_index"] < g["ci95"][1]
    (term,) = g["benchmarks"]
    assert term["ci95"] == g["ci95"] and term["within_noise"] is False  # one benchmark: the term is the index
    assert term["comparison"]["paired"] and term["comparison"]["tasks"] == 40 and not term["comparison"]["within_noise"]
    assert term["comparison"]["diff"] == pytest.approx(term["submitted"] - term["initial"])
    assert term["dev_vs_official"]["a"] == pytest.approx(2 / 3) and not term["dev_vs_official"]["paired"]
    assert term["pass_at_k"]["initial"]["pass@3"] == pytest.approx(0.5)
    assert term["pass_at_k"]["submitted"]["solved_all@3"] == pytest.approx(0.75)
    assert i["ci95"] == [0.0, 0.0] and i["within_noise"] is True
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Comparisons" in md and "beyond noise" in md and "within noise" in md and "pass@3" in md
    assert "2000 resamples at seed 57" in md


def test_flagged_runs_are_left_out_by_default_and_repeats_grouped(served: str, store: Store, tmp_path: Path) -> None:
    with httpx.Client(base_url=served) as c:
        runs = [create_key(c, track="joint", name="joint-arith", budget_usd=5.0,
                           run={"task": "joint-arith", "agent": "rep", "agent_version": "1"})["id"] for _ in range(3)]
    add_score(store, "initial", "arithmetic", 0.4)
    for n, (run, score) in enumerate(zip(runs, (0.7, 0.64, 1.0), strict=True)):
        add_score(store, run, "arithmetic", score, model=f"ckpt_{n}", minutes=1)
    with store.transaction() as s:
        s.add(AuditRow(id="aud_f", run_id=runs[2], status="flagged", hacking_rate=1.0, report={}, created_at=T0))

    data = rsigym("report", "--out", str(tmp_path / "r"), "--json")
    (agent,) = data["agents"]
    assert agent["flagged_runs"] == [runs[2]] and agent["runs_in_index"] == 2
    assert agent["rsi_index"] == pytest.approx((0.5 + 0.4) / 2) and "rsi_index_with_flagged" not in agent
    assert agent["ci95"][0] < agent["rsi_index"] < agent["ci95"][1]
    (group,) = data["groups"]
    assert (group["agent"], group["track"], group["task"], group["budget_usd"]) == ("rep@1", "joint", "joint-arith", 5.0)
    assert group["runs"] == runs and group["rsi_index"]["n"] == 2 and "t-interval" in group["rsi_index"]["method"]
    assert "flagged (not in the index)" in (tmp_path / "r" / "report.md").read_text()

    both = rsigym("report", "--out", str(tmp_path / "b"), "--include-flagged", "--json")
    (agent,) = both["agents"]
    assert agent["rsi_index"] == pytest.approx(0.45) and agent["rsi_index_with_flagged"] == pytest.approx((0.5 + 0.4 + 1.0) / 3)
    assert both["include_flagged"] and both["groups"][0]["rsi_index"]["n"] == 3
    assert "RSI-Index with flagged" in (tmp_path / "b" / "report.md").read_text()
