"""`rsigym score RUN --subset N --seed S --reference MODEL` against a real embedded gym (issue 54,
item 4 and the scoring part of item 6).

A three-task official split (generated at registration from the gym's seed); two of its tasks are
scored, drawn by seed 23, for the initial system, the reference model and the run alike: the same
task ids in every job, each score row naming the subset, its seed and the split's seed. The report
names them too, shows the reference next to the initial system, and leaves it out of the index.
Real trials: bubblewrap sandboxes and the tiny model, one attempt a task."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from kit.config import BaseModel_
from ops.builder import Gym
from ops.cli.main import app as operator_cli
from rsigym import Gym as Sdk
from services.evaluation.subsets import draw_subset
from services.evaluation.tables import EvaluationJob
from tests.conftest import ADMIN_TOKEN, admin_headers, create_key, gym_config
from tests.fakes.live_gym import mini_benchmark, registered_tasks
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

ROOT = Path(__file__).resolve().parents[4]
REFERENCE = "tiny-ref"
"""A second base model (the tiny model's weights under another name): the reference system."""
SUBSET, SEED = 2, 23


@pytest.fixture
def served(make_gym: Callable[..., Gym], standin: tuple[str, Any],
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Gym]]:
    config = gym_config(standin[0])
    config.models = [*config.models, BaseModel_(name=REFERENCE, path="builtin:tiny", train_usd_per_mtok=2.0,
                                                prefill_usd_per_mtok=0.2, sample_usd_per_mtok=0.6)]
    gym = make_gym(config=config)
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield url, gym
    gym.service_apps["evaluation"].state.evaluation.runner.wait_idle(timeout=120)


def rsigym(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args and code == 0 else result


def job_tasks(gym: Gym, job_id: str) -> list[str]:
    with gym.service_apps["evaluation"].state.evaluation.store.transaction() as s:
        return list(s.scalar(select(EvaluationJob.task_ids).where(EvaluationJob.id == job_id)))


def test_initial_reference_and_run_are_scored_on_one_seeded_subset(served: tuple[str, Gym], tmp_path: Path) -> None:
    url, gym = served
    registered = rsigym("benchmarks", "register", str(mini_benchmark(tmp_path, per_split=3)), "--wait", "--json")
    assert registered["status"] == "ready", registered
    official = [t.id for t in registered_tasks(gym, "mini")]
    assert len(official) == 3
    with httpx.Client(base_url=url) as c:
        run = create_key(c, track="harness", name="agent-h", budget_usd=5.0)
    with Sdk(base_url=url, api_key=run["key"], max_retries=0) as sdk:
        sdk.submit(harness=sdk.evaluation.upload_harness(ROOT / "agent_container" / "harness" / "minimal").id)

    http = httpx.Client(base_url=url, headers=admin_headers(), timeout=60)
    refused = http.post(f"/admin/v1/runs/{run['id']}/score", json={"attempts": 1, "subset": 4, "subset_seed": SEED})
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "subset", refused.text
    assert "mini/official has 3" in refused.json()["error"]["message"]
    unseeded = http.post(f"/admin/v1/runs/{run['id']}/score", json={"attempts": 1, "subset": SUBSET})
    assert unseeded.status_code == 422 and unseeded.json()["error"]["param"] == "subset_seed", unseeded.text
    unknown = http.post(f"/admin/v1/runs/{run['id']}/score", json={"attempts": 1, "reference": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "reference", unknown.text
    assert http.get(f"/admin/v1/keys/{run['id']}").json().get("ends_at") is None  # refused before the run ended

    out = rsigym("score", run["id"], "--attempts", "1", "--subset", str(SUBSET), "--seed", str(SEED),
                 "--reference", REFERENCE, "--wait", "--json")
    assert out["subset"] == {"size": SUBSET, "seed": SEED} and out["reference"] == REFERENCE
    rows = {r["run_id"]: r for r in out["data"]}
    assert set(rows) == {"initial", "reference", run["id"]}, out["data"]
    drawn = draw_subset(official, SUBSET, SEED)
    fingerprint = registered["splits"]["official"]["generated"]["seed_fingerprint"]
    for r in rows.values():
        assert r["status"] == "succeeded" and r["progress"] == {"done": SUBSET, "total": SUBSET}, r
        assert (r["split"], r["subset"], r["subset_seed"]) == ("official", SUBSET, SEED)
        assert r["split_seed"] == f"gym seed {fingerprint}"
        assert job_tasks(gym, r["job_id"]) == drawn  # the same tasks for every system
    assert rows["reference"]["model"] == REFERENCE and rows["reference"]["harness"] == "minimal"
    assert rows["initial"]["model"] == rows[run["id"]]["model"] != REFERENCE  # the run kept its base model
    assert all(r["subset"] is None for r in out["dev_scores"])  # the score-gap check's dev score: the whole split

    report = rsigym("report", "--out", str(tmp_path / "report"), "--json")
    assert [r["run_id"] for r in report["runs"]] == [run["id"]]  # the reference is no run of the index
    (bench,) = report["runs"][0]["benchmarks"]
    assert (bench["benchmark"], bench["split"], bench["subset"], bench["subset_seed"], bench["split_seed"]) == \
        ("mini", "official", SUBSET, SEED, f"gym seed {fingerprint}")
    s0, s = rows["initial"]["score"], rows[run["id"]]["score"]
    assert (bench["initial"], bench["submitted"]) == (s0, s)
    assert bench["reference"] == {"model": REFERENCE, "score": rows["reference"]["score"],
                                  "gap_to_reference": rows["reference"]["score"] - s,
                                  "initial_gap_to_reference": rows["reference"]["score"] - s0, "in_rsi_index": False}
    assert report["runs"][0]["rsi_index"] == (None if s0 == 1.0 else pytest.approx((s - s0) / (1 - s0)))
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"| {run['id']} | mini | official | {SUBSET} | {SEED} | gym seed {fingerprint} | 1 |" in md
    assert "gap to reference" in md and REFERENCE in md

    # The baselines are cached per scope: the same subset and seed reuses them, another seed does not.
    again = http.post(f"/admin/v1/runs/{run['id']}/score",
                      json={"attempts": 1, "subset": SUBSET, "subset_seed": SEED, "reference": REFERENCE})
    assert again.status_code == 202, again.text
    assert [r["run_id"] for r in again.json()["data"]] == [run["id"]]
    other = http.post(f"/admin/v1/runs/{run['id']}/score", json={"attempts": 1, "subset": SUBSET, "subset_seed": 7})
    assert other.status_code == 202, other.text
    reseeded = {r["run_id"]: r for r in other.json()["data"]}
    assert set(reseeded) == {"initial", run["id"]} and reseeded["initial"]["subset_seed"] == 7
    assert job_tasks(gym, reseeded["initial"]["job_id"]) == draw_subset(official, SUBSET, 7)
