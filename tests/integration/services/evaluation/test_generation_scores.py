"""Scores across generations against a real embedded gym (issue 58 item 2).

Generation 1 submits a harness and is scored; generation 2 (a ``RunGeneration`` row, as
``run start --from`` writes it) starts from that system and submits another harness. Scoring it
scores its initial system (the base model with generation 1's harness: the same model as the
cached generation-0 baseline, another harness, so not deduplicated away) and reuses generation
0's cached score; ``rsigym score --json`` gives both indices and ``rsigym report`` draws the chain
0, 1, 2. Real trials: bubblewrap sandboxes and the tiny model, one attempt a task, two tasks."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from ops.builder import Gym
from ops.cli.main import app as operator_cli
from rsigym import Gym as Sdk
from storage.tables import RunGeneration
from tests.conftest import ADMIN_TOKEN, create_key, gym_config
from tests.fakes.live_gym import mini_benchmark
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

ROOT = Path(__file__).resolve().parents[4]
MINIMAL_DIR = ROOT / "agent_container" / "harness" / "minimal"
SCOPE = ["--attempts", "1", "--subset", "2", "--seed", "23"]


@pytest.fixture
def served(make_gym: Callable[..., Gym], standin: tuple[str, Any],
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Gym]]:
    gym = make_gym(config=gym_config(standin[0]))
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield url, gym
    gym.service_apps["evaluation"].state.evaluation.runner.wait_idle(timeout=120)


def rsigym(*args: str) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result


def harness_run(url: str, name: str) -> tuple[dict[str, Any], str, str]:
    """A harness-track run that uploads the minimal harness as its own and submits it."""
    with httpx.Client(base_url=url) as c:
        run = create_key(c, track="harness", name=name, budget_usd=5.0)
    with Sdk(base_url=url, api_key=run["key"], max_retries=0) as sdk:
        harness = sdk.evaluation.upload_harness(MINIMAL_DIR).id
        submission = sdk.submit(harness=harness).id
    return run, harness, submission


def test_generation_two_is_scored_against_its_initial_system_and_generation_0(
        served: tuple[str, Gym], tmp_path: Path) -> None:
    url, gym = served
    assert rsigym("benchmarks", "register", str(mini_benchmark(tmp_path, per_split=3)), "--wait",
                  "--json")["status"] == "ready"
    run1, h1, sub1 = harness_run(url, "gen-1")
    first = {r["run_id"]: r for r in rsigym("score", run1["id"], *SCOPE, "--wait", "--json")["data"]}
    assert set(first) == {"initial", run1["id"]}
    base, s0, s1 = first["initial"]["model"], first["initial"]["score"], first[run1["id"]]["score"]
    assert first["initial"]["harness"] == "minimal"

    run2, h2, _ = harness_run(url, "gen-2")
    assert h2 != h1
    with gym.service_apps["evaluation"].state.evaluation.store.transaction() as s:
        s.add(RunGeneration(run_id=run2["id"], from_run_id=run1["id"], chain_root_id=run1["id"], generation=2,
                            submission_id=sub1, audit_id="aud_unused", initial_model=base, initial_harness=h1,
                            initial_weights_hash=None,
                            base_model=base))
    out = rsigym("score", run2["id"], *SCOPE, "--wait", "--json")
    started = {(r["run_id"], r["model"], r["harness"]): r for r in out["data"]}
    # the initial system (base + generation 1's harness) is scored: same model as the cached gen-0
    # baseline, another harness; generation 0 (base + minimal) on this scope is reused, not rescored
    assert set(started) == {("initial", base, "minimal"), ("initial", base, h1), (run2["id"], base, h2)}, out["data"]
    assert started[("initial", base, "minimal")]["id"] == first["initial"]["id"]  # the cached gen-0 score
    initial = started[("initial", base, h1)]
    assert initial["status"] == "succeeded" and initial["subset"] == 2 and initial["subset_seed"] == 23
    s_init, s2 = initial["score"], started[(run2["id"], base, h2)]["score"]
    indices = out["rsi_index"]
    assert indices["generation"]["generation"] == 2 and indices["generation"]["from_run_id"] == run1["id"]
    vs_initial = indices["generation"]["rsi_index_vs_initial"]["rsi_index"]
    vs_zero = indices["generation"]["rsi_index_vs_generation_0"]["rsi_index"]
    assert vs_initial == (None if s_init == 1.0 else pytest.approx((s2 - s_init) / (1 - s_init)))
    assert vs_zero == (None if s0 == 1.0 else pytest.approx((s2 - s0) / (1 - s0)))
    assert indices["rsi_index"] == vs_initial
    assert {c["vs"] for c in out["comparisons"]} == {"initial", "generation_0"}

    report = rsigym("report", "--out", str(tmp_path / "report"), "--json")
    runs = {r["run_id"]: r for r in report["runs"]}
    assert runs[run1["id"]]["generation"] is None
    assert runs[run1["id"]]["benchmarks"][0]["initial"] == s0  # gen 1 pairs with gen 0, not gen 2's initial
    assert runs[run2["id"]]["benchmarks"][0]["initial"] == s_init
    (chain,) = report["chains"]
    assert chain["run_id"] == run2["id"]
    assert [(p["generation"], p["run_id"], p["score"]) for p in chain["benchmarks"][0]["points"]] == \
        [(0, None, s0), (1, run1["id"], s1), (2, run2["id"], s2)]
    assert all(p["ci95"] is not None for p in chain["benchmarks"][0]["points"])
    assert (tmp_path / "report" / chain["figure"]).stat().st_size > 0
    assert "## Chains" in (tmp_path / "report" / "report.md").read_text()

    again = httpx.post(f"{url}/admin/v1/runs/{run2['id']}/score", timeout=60,
                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                       json={"attempts": 1, "subset": 2, "subset_seed": 23})
    assert again.status_code == 202, again.text  # both baselines cached per system now: only the run
    assert [r["run_id"] for r in again.json()["data"]] == [run2["id"]]
    assert again.json()["generation"]["initial_harness"] == h1
