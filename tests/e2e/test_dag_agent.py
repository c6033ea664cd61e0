"""The reviewer-guided research DAG agent (agent_container/agents/dag.py) on the joint track of an
embedded gym: the tiny model, the stand-in teacher, a two-task arithmetic benchmark, and the
stand-in as the agent-route model (scripted answers read off the agent's JSON).

It runs as a launched agent would — its own process, the run key and the rendered instruction in
its environment — is stopped after its first round, and started again: the second process finds
where the first left off in the records alone. The tests read the research graph from the records:
two Workers in parallel on child keys of their own, one review spanning both by a Reviewer key, a
decision that branches from the review into a Worker continuing both, a stop, a submission; and
that a Worker's key (the policy the agent minted it with) reads neither a sibling's records nor
per-trial results."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit.config import GymConfig
from kit.settings import GymSettings, ProviderSecrets
from ops.builder import build_embedded
from ops.tasks import find_task, key_body, render_instruction
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, TEACHER_ENV, admin_headers, bearer, gym_config, require_bwrap
from tests.fakes.live_gym import LiveGym, mini_benchmark
from tests.fakes.servers import serve_gym

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent_container" / "agents" / "dag.py"
ARGS = ["--max-rounds", "2", "--limit", "2", "--rows", "16", "--steps", "4", "--poll", "0.3"]
TASK = "joint-arithmetic"


def _config(api_base: str) -> GymConfig:
    raw = gym_config(api_base).model_dump(mode="json")
    raw["agent_models"] = [{"name": "lead", "litellm_model": "openai/standin", "served_by": "standin",
                            "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0}]
    return GymConfig.model_validate(raw)


def _agent(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", str(AGENT), *ARGS, *extra], env=env, capture_output=True, text=True,
                          timeout=900)


def _lines(out: str, name: str) -> list[Any]:
    return [json.loads(line.partition(": ")[2]) for line in out.splitlines() if line.startswith(f"{name}: ")]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, standin: tuple[str, Any], teacher_secret: str) -> Iterator[dict[str, Any]]:
    require_bwrap()
    root = tmp_path_factory.mktemp("dag")
    bench = mini_benchmark(root / "bench", name="arithmetic", per_split=2)
    settings = GymSettings(data_dir=root / "gym", admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR)
    gym = build_embedded(settings, config=_config(standin[0]), run_reaper=False,
                         provider_secrets=ProviderSecrets({TEACHER_ENV: teacher_secret}))
    with serve_gym(gym) as url, httpx.Client(base_url=url, headers=admin_headers(), timeout=60) as admin:
        assert LiveGym(url, gym).register(bench)["status"] == "ready"
        task = find_task(TASK)
        key = admin.post("/admin/v1/keys", json=key_body(task, gym.gateway.config)).json()
        instruction = root / "instruction.md"
        instruction.write_text(render_instruction(task, gym.gateway.config))
        env = {"RSIGYM_URL": url, "RSIGYM_API_KEY": key["key"], "RSIGYM_INSTRUCTION": str(instruction),
               "PATH": "/usr/bin:/bin", "HOME": str(root)}
        first = _agent(env, "--stop-after-rounds", "1")
        between = admin.get(f"/admin/v1/runs/{key['id']}/experiments").json()["data"]
        second = _agent(env)
        yield {"url": url, "key": key, "first": first, "second": second, "between": between,
               "experiments": admin.get(f"/admin/v1/runs/{key['id']}/experiments").json()["data"],
               "events": admin.get(f"/admin/v1/runs/{key['id']}/events", params={"limit": 1000}).json()["data"],
               "keys": {k["id"]: k for k in admin.get("/admin/v1/keys", params={"parent_id": key["id"]}).json()["data"]},
               "annotations": httpx.get(f"{url}/records/v1/annotations", headers=bearer(key["key"])).json()["data"]}
    for name in ("evaluation", "training"):
        getattr(gym.service_apps[name].state, name).runner.shutdown()


def _by_kind(run: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [a for a in run["annotations"] if a["kind"] == kind]


def test_a_round_runs_two_workers_in_parallel_a_review_across_both_and_a_branching_decision(run: dict[str, Any]) -> None:
    first = run["first"]
    assert first.returncode == 3, first.stdout[-3000:] + first.stderr[-3000:]  # paused before round 2, as asked
    plan, branch, stop = _by_kind(run, "decision")  # the plan, round 1's decision, round 2's
    assert plan["action"] == "branch" and len(plan["directions"]) == 2 and plan["experiment_ids"] == []
    round1 = [e for e in run["experiments"] if e["name"].startswith(plan["id"] + "#")]
    assert len(round1) == 2 and len({e["owner_key_id"] for e in round1}) == 2  # two Workers, a child key each
    assert all(run["keys"][e["owner_key_id"]]["parent_id"] == run["key"]["id"] for e in round1)
    findings = {f["experiment_ids"][0]: f for f in _by_kind(run, "finding")}
    # in parallel: each Worker's experiment was created before the other finished
    created = [datetime.fromisoformat(e["created_at"]) for e in round1]
    finished = [datetime.fromisoformat(findings[e["id"]]["created_at"]) for e in round1]
    assert max(created) < min(finished), (created, finished)
    # one review spanning both, written by a Reviewer key that is neither Worker nor the Main agent
    [review] = [r for r in _by_kind(run, "review") if set(r["experiment_ids"]) == {e["id"] for e in round1}]
    assert review["key_id"] not in {e["owner_key_id"] for e in round1} | {run["key"]["id"]}
    assert review["findings_supported"] and review["missing_comparisons"]
    # the Reviewer read the data itself: a row of the teacher-data Worker's dataset is quoted
    assert any("rows read as intended" in p and "What is" in p for p in review["findings_supported"]), review
    reviewer = run["keys"][review["key_id"]]
    assert sorted(reviewer["policy"]["services"]["records"]["owners"]) == sorted(e["owner_key_id"] for e in round1)
    # the Main agent's decision reacts to the review and both findings, and branches
    assert branch["action"] == "branch" and branch["key_id"] == run["key"]["id"]
    assert set(branch["reacts_to"]) == {review["id"], *(findings[e["id"]]["id"] for e in round1)}
    assert set(branch["experiment_ids"]) == {e["id"] for e in round1} and branch["directions"]
    assert stop["action"] == "stop"


def test_a_restart_resumes_from_the_records_and_the_branch_continues_both_workers(run: dict[str, Any]) -> None:
    second = run["second"]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    # nothing of round 1 was redone: the same experiments, one plan, one review of them
    assert [e["id"] for e in run["between"]] == [e["id"] for e in run["experiments"][:len(run["between"])]]
    assert not _lines(second.stdout, "thought") or _lines(second.stdout, "thought")[0]["role"] != "main-plan"
    decisions = _by_kind(run, "decision")
    assert len(decisions) == 3
    branch = decisions[1]
    [round2] = [e for e in run["experiments"] if e["name"].startswith(branch["id"] + "#")]
    assert sorted(round2["parents"]) == sorted(branch["experiment_ids"])  # continues both Workers' experiments
    assert any(set(r["experiment_ids"]) == {round2["id"]} for r in _by_kind(run, "review"))
    [submitted] = _lines(second.stdout, "submitted")
    assert submitted and set(submitted["body"]) == {"checkpoint", "harness"}
    assert submitted["body"]["checkpoint"].startswith("ckpt_")
    # the Main agent never experimented itself: every training and evaluation came from a Worker key
    main = run["key"]["id"]
    acting = [e for e in run["events"] if e["kind"] in ("training.job", "evaluation.job", "dataset.registered")]
    assert acting and all(e["key_id"] != main for e in acting)
    thoughts = [e for e in run["events"] if e["kind"] == "call.refused"]
    assert thoughts == [], thoughts


def test_a_workers_key_reads_neither_a_siblings_records_nor_per_trial_results(run: dict[str, Any]) -> None:
    plan = _by_kind(run, "decision")[0]
    mine, sibling = [e for e in run["experiments"] if e["name"].startswith(plan["id"] + "#")]
    policy = run["keys"][mine["owner_key_id"]]["policy"]
    assert policy["services"]["evaluation"]["detail"] == "aggregate"
    # a key with exactly the policy the agent gave its Worker, minted by the run key, attacks
    with httpx.Client(base_url=run["url"], timeout=60) as c:
        worker = c.post("/v1/keys", json={"name": "attacker", "policy": policy}, headers=bearer(run["key"]["key"])).json()
        as_worker = bearer(worker["key"])
        assert c.get(f"/records/v1/experiments/{sibling['id']}", headers=as_worker).status_code == 404
        listed = c.get("/records/v1/experiments", headers=as_worker).json()["data"]
        assert sibling["id"] not in {e["id"] for e in listed}
        annotations = c.get("/records/v1/annotations", headers=as_worker).json()["data"]
        assert not [a for a in annotations if sibling["id"] in a["experiment_ids"]]
        job = next(e["data"]["job_id"] for e in run["events"]
                   if e["kind"] == "evaluation.job" and e.get("experiment_id") == sibling["id"])
        results = c.get(f"/evaluation/v1/jobs/{job}/results", headers=as_worker)
        assert results.status_code == 403 and "reward" not in results.text
