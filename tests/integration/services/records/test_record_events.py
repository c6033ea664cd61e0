"""The platform writes its own record: every dataset, training job, checkpoint, harness,
submission, sandbox session and refused call of a run becomes a hash-chained event, and
training attaches to the experiment the caller names (its own) or to an implicit one that
continues the experiment its parent checkpoint came from.

One live gym for the module (tiny model, 2-step jobs); the agent acts through the real
gateway, as an agent would, and the test reads what the platform recorded."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from access.keys import KeyRegistry
from access.policy import Policy
from services.records.events import (
    CALL_REFUSED,
    CHECKPOINT_REGISTERED,
    DATASET_REGISTERED,
    EVALUATION_JOB,
    EXPERIMENT_CREATED,
    HARNESS_UPLOADED,
    SANDBOX_SESSION,
    SUBMISSION,
    TRAINING_JOB,
    EventLog,
    RecordEvent,
)
from services.training.tables import TrainingJob
from tests.fakes.live_gym import LiveGym, harness_archive, live_gym, mini_benchmark

ROWS = [{"messages": [{"role": "user", "content": f"Repeat: red lion {i}"},
                      {"role": "assistant", "content": f"red lion {i}"}]} for i in range(8)]
RAW = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
TINY_JOB = {"base_model": "tiny", "steps": 2, "batch_size": 4, "max_length": 64}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGym]:
    with live_gym(tmp_path_factory.mktemp("gym")) as served:
        yield served


@pytest.fixture(scope="module")
def run(live: LiveGym) -> dict[str, Any]:
    """One run (joint track) with two sibling child keys, a worker and a reviewer."""
    root = live.key(budget=5.0)
    with live.agent(root) as agent:
        children = {}
        for name in ("worker", "reviewer"):
            r = agent.post("/v1/keys", json={"name": name})
            assert r.status_code == 201, r.text
            children[name] = r.json()
    return {"root": root, **children}


def _events(live: LiveGym, run_id: str, kind: str) -> list[RecordEvent]:
    return EventLog(live.gym.gateway.store, live.gym.gateway.internal_secret).events(run_id, kinds=(kind,))


def _wait_training(agent: httpx.Client, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        job = agent.get(f"/training/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled", "budget_exhausted"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"training job {job_id} did not finish")


def _job_rows(live: LiveGym, run_id: str) -> int:
    with live.gym.gateway.store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(TrainingJob).where(TrainingJob.run_id == run_id)) or 0)


def test_training_is_recorded_and_attached_to_experiments(live: LiveGym, run: dict[str, Any]) -> None:
    run_id, worker = run["root"]["id"], run["worker"]
    with live.agent(worker) as agent:
        ds = agent.post("/training/v1/datasets", content=RAW, params={"name": "lions"}).json()
        again = agent.post("/training/v1/datasets", content=RAW).json()
        assert again["id"] == ds["id"]
        [registered] = _events(live, run_id, DATASET_REGISTERED)  # the re-upload is not a second dataset
        assert registered.key_id == worker["id"]
        assert registered.data == {"dataset_id": ds["id"], "sha256": hashlib.sha256(RAW).hexdigest(),
                                   "rows": len(ROWS), "bytes": len(RAW), "format": "chat", "name": "lions"}

        first = agent.post("/training/v1/jobs", json={"datasets": [ds["id"]], **TINY_JOB}).json()
        first = _wait_training(agent, first["id"])
        assert first["status"] == "succeeded", first
        exp1 = first["experiment"]
        [ckpt1] = first["checkpoints"]

        second = agent.post("/training/v1/jobs", json={"datasets": [ds["id"]], "parent_checkpoint": ckpt1,
                                                       "steps": 2, "batch_size": 4, "max_length": 64}).json()
        second = _wait_training(agent, second["id"])
        assert second["status"] == "succeeded", second
        exp2 = second["experiment"]

    created = {e.experiment_id: e for e in _events(live, run_id, EXPERIMENT_CREATED)}
    assert exp1 and exp2 and exp1 != exp2
    assert created[exp1].data["implicit"] is True and created[exp1].data["parents"] == []
    assert created[exp1].key_id == worker["id"]
    assert created[exp2].data["parents"] == [exp1]  # starting from its checkpoint continues the first experiment

    jobs = {e.data["job_id"]: e for e in _events(live, run_id, TRAINING_JOB)}
    assert set(jobs) == {first["id"], second["id"]}  # one event per job, however it ended
    one = jobs[first["id"]]
    assert (one.key_id, one.experiment_id) == (worker["id"], exp1)
    assert one.data["status"] == "succeeded" and one.data["input_checkpoint"] is None
    assert one.data["datasets"] == [{"id": ds["id"], "sha256": hashlib.sha256(RAW).hexdigest()}]
    assert one.data["output_checkpoints"] == [ckpt1] and one.data["steps"] == 2 and one.data["cost_nusd"] > 0
    assert jobs[second["id"]].data["input_checkpoint"] == ckpt1
    assert jobs[second["id"]].experiment_id == exp2

    ckpts = {e.data["checkpoint_id"]: e for e in _events(live, run_id, CHECKPOINT_REGISTERED)}
    assert ckpts[ckpt1].experiment_id == exp1 and ckpts[ckpt1].data["job_id"] == first["id"]
    assert ckpts[ckpt1].key_id == worker["id"] and ckpts[ckpt1].data["parent_checkpoint"] is None
    [ckpt2] = second["checkpoints"]
    assert ckpts[ckpt2].experiment_id == exp2 and ckpts[ckpt2].data["parent_checkpoint"] == ckpt1
    with live.agent(worker) as agent:
        assert agent.get(f"/training/v1/checkpoints/{ckpt1}").json()["experiment"] == exp1

        # Naming its own experiment attaches there; the config hash is that of the same job without it.
        named = agent.post("/training/v1/jobs", json={"datasets": [ds["id"]], **TINY_JOB, "experiment": exp1}).json()
        assert named["experiment"] == exp1 and "experiment" not in named["config"]
        agent.post(f"/training/v1/jobs/{named['id']}/cancel")
        assert _wait_training(agent, named["id"])["status"] in ("cancelled", "succeeded")
    with live.gym.gateway.store.transaction() as s:
        hashes = {s.get(TrainingJob, j).config_hash for j in (first["id"], named["id"])}
    assert len(hashes) == 1
    run["dataset"], run["checkpoint"], run["experiment"] = ds["id"], ckpt1, exp1


def test_a_sibling_cannot_attach_to_anothers_experiment(live: LiveGym, run: dict[str, Any]) -> None:
    run_id = run["root"]["id"]
    if "experiment" not in run:
        pytest.skip("needs the training test's experiment")
    before = _job_rows(live, run_id)
    with live.agent(run["reviewer"]) as reviewer:
        ds = reviewer.post("/training/v1/datasets", content=RAW).json()
        r = reviewer.post("/training/v1/jobs", json={"datasets": [ds["id"]], **TINY_JOB,
                                                     "experiment": run["experiment"]})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["param"] == "experiment"
        missing = reviewer.post("/training/v1/jobs", json={"datasets": [ds["id"]], **TINY_JOB,
                                                           "experiment": "exp_doesnotexist"})
        assert missing.status_code == 404, missing.text
    assert _job_rows(live, run_id) == before  # neither refused job left a row (nor an experiment)
    refused = [e for e in _events(live, run_id, CALL_REFUSED)
               if e.key_id == run["reviewer"]["id"] and e.data["service"] == "training"]
    assert [e.data["status"] for e in refused] == [403]  # the 404 is not a refusal
    assert refused[0].data["error"] == "permission_denied" and "another key" in refused[0].data["rule"]


def test_policy_and_budget_refusals_are_recorded_with_key_and_rule(live: LiveGym) -> None:
    data_run = live.key(budget=1.0, track="data")
    with live.agent(data_run) as agent:
        ds = agent.post("/training/v1/datasets", content=RAW).json()
        r = agent.post("/training/v1/jobs", json={"datasets": [ds["id"]], "base_model": "tiny", "lora": {"rank": 64}})
        assert r.status_code == 403, r.text
        broke = agent.post("/v1/keys", json={"name": "broke", "budget_usd": 0})
        assert broke.status_code == 201, broke.text
    with live.agent(broke.json()) as poor:
        r402 = poor.post("/inference/v1/chat/completions",
                         json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        assert r402.status_code == 402, r402.text
    [policy, budget] = _events(live, data_run["id"], CALL_REFUSED)
    assert policy.key_id == data_run["id"]
    assert policy.data == {"where": "gateway", "service": "training", "operation": policy.data["operation"],
                           "status": 403, "error": "permission_denied", "rule": r.json()["error"]["message"],
                           "param": "lora.rank"}
    assert "lora.rank" in policy.data["rule"]
    assert budget.key_id == broke.json()["id"] and budget.data["status"] == 402
    assert budget.data["error"] == "budget_exhausted" and budget.data["service"] == "inference"
    assert budget.data["rule"] == r402.json()["error"]["message"]


def test_harness_and_submission_are_recorded(live: LiveGym, run: dict[str, Any]) -> None:
    if "checkpoint" not in run:
        pytest.skip("needs the training test's checkpoint")
    run_id, worker = run["root"]["id"], run["worker"]
    raw = harness_archive("mine", "echo 0 > /app/answer.txt\n")
    with live.agent(worker) as agent:
        harness = agent.post("/evaluation/v1/harnesses", content=raw).json()
        sub = agent.post("/evaluation/v1/submissions", json={"checkpoint": run["checkpoint"],
                                                             "harness": harness["id"]})
        assert sub.status_code == 201, sub.text
    [uploaded] = _events(live, run_id, HARNESS_UPLOADED)
    assert uploaded.key_id == worker["id"]
    assert uploaded.data["harness_id"] == harness["id"]
    assert uploaded.data["sha256"] == hashlib.sha256(raw).hexdigest() and uploaded.data["name"] == "mine"
    [submitted] = _events(live, run_id, SUBMISSION)
    assert submitted.experiment_id == run["experiment"]
    assert submitted.data == {"submission_id": sub.json()["id"], "checkpoint": run["checkpoint"],
                              "model": run["checkpoint"], "harness": harness["id"], "track": "joint"}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_door_refusal_and_the_sandbox_session_are_recorded(live: LiveGym) -> None:
    from e2b import Sandbox

    run_key = live.key(budget=2.0)
    registry = KeyRegistry(live.gym.gateway.store)
    sandbox_view, sandbox_key = registry.create(
        policy=Policy.model_validate({"services": {"sandbox": {"door": True, "internet": False, "max_concurrency": 1}}}),
        budget_nusd=None, parent_id=run_key["id"], platform=True)
    _, door_key = registry.create(
        policy=Policy.model_validate({"services": {"inference": {"models": ["tiny"], "max_concurrency": 1}}}),
        budget_nusd=None, parent_id=run_key["id"], platform=True)
    created = httpx.post(f"{live.url}/sandbox/v2/sandboxes", headers={"X-API-Key": sandbox_key},
                         json={"templateID": "base", "timeout": 120, "rsigymDoor": {"key": door_key}})
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["sandboxID"]
    sbx = Sandbox.connect(sandbox_id, api_key=sandbox_key, api_url=f"{live.url}/sandbox",
                          sandbox_url=f"{live.url}/sandbox/envd")
    try:
        probe = ("import urllib.request, urllib.error\n"
                 "try:\n    urllib.request.urlopen('http://127.0.0.1:8700/training/v1/jobs', timeout=20)\n"
                 "except urllib.error.HTTPError as e:\n    print(e.code)\n")
        out = sbx.commands.run(f"python3 -c \"{probe}\"", timeout=60)
        assert out.stdout.strip() == "403", out
    finally:
        sbx.kill()

    [refused] = _events(live, run_key["id"], CALL_REFUSED)
    assert refused.key_id == sandbox_view["id"]
    assert refused.data == {"where": "door", "sandbox_id": sandbox_id, "method": "GET", "path": "/training/v1/jobs",
                            "status": 403, "error": "permission_denied", "rule": refused.data["rule"]}
    assert "/inference/v1/" in refused.data["rule"]
    [session] = _events(live, run_key["id"], SANDBOX_SESSION)
    assert session.key_id == sandbox_view["id"]
    assert session.data["sandbox_id"] == sandbox_id and session.data["state"] == "killed"
    assert session.data["template"] == "base" and session.data["seconds"] > 0 and session.data["cost_nusd"] > 0


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_evaluations_attach_to_the_checkpoints_experiment_and_are_recorded(
        live: LiveGym, run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    if "checkpoint" not in run:
        pytest.skip("needs the training test's checkpoint")
    run_id, ckpt, exp1 = run["root"]["id"], run["checkpoint"], run["experiment"]
    row = live.register(mini_benchmark(tmp_path_factory.mktemp("bench"), name="mini", per_split=1))
    assert row["status"] == "ready", row
    body = {"benchmark": "mini", "split": "dev", "model": ckpt, "limit": 1,
            "sampling": {"max_tokens": 8}}
    with live.agent(run["worker"]) as worker:
        job = worker.post("/evaluation/v1/jobs", json=body).json()
        assert job["experiment"] == exp1  # the worker's own checkpoint: its experiment
        done = live.wait_job(worker, job["id"])
    with live.agent(run["reviewer"]) as reviewer:
        refused = reviewer.post("/evaluation/v1/jobs", json={**body, "experiment": exp1})
        assert refused.status_code == 403, refused.text
        other = reviewer.post("/evaluation/v1/jobs", json=body).json()
        assert other["experiment"] not in (None, exp1)  # a new experiment of the reviewer's own
        reviewer.post(f"/evaluation/v1/jobs/{other['id']}/cancel")
        other_done = live.wait_job(reviewer, other["id"])

    jobs = {e.data["job_id"]: e for e in _events(live, run_id, EVALUATION_JOB)}
    assert set(jobs) == {job["id"], other["id"]}
    mine = jobs[job["id"]]
    assert (mine.key_id, mine.experiment_id) == (run["worker"]["id"], exp1)
    assert mine.data == {"job_id": job["id"], "purpose": "agent", "status": done["status"], "model": ckpt,
                         "harness": "minimal", "benchmark": "mini", "split": "dev", "attempts": 1,
                         "score": done["score"] if done["status"] == "succeeded" else None}
    assert done["status"] == "succeeded" and mine.data["score"] is not None
    theirs = jobs[other["id"]]
    assert (theirs.key_id, theirs.experiment_id) == (run["reviewer"]["id"], other["experiment"])
    assert theirs.data["status"] == other_done["status"]
    created = {e.experiment_id: e for e in _events(live, run_id, EXPERIMENT_CREATED)}
    assert created[other["experiment"]].data["parents"] == [exp1]
    assert created[other["experiment"]].key_id == run["reviewer"]["id"]


def test_every_chain_verifies_after_all_of_it(live: LiveGym, run: dict[str, Any]) -> None:
    log = EventLog(live.gym.gateway.store, live.gym.gateway.internal_secret)
    with live.gym.gateway.store.transaction() as s:
        runs = list(s.scalars(select(RecordEvent.run_id).distinct()))
    assert run["root"]["id"] in runs
    for run_id in runs:
        report = log.verify(run_id)
        assert report.ok and report.events > 0, report.view()


def test_config_hash_ignores_the_experiment_field() -> None:
    from services.training.schemas import JobRequest

    plain = JobRequest.model_validate({"datasets": ["ds_1"], **TINY_JOB})
    named = JobRequest.model_validate({"datasets": ["ds_1"], **TINY_JOB, "experiment": "exp_1"})
    assert plain.config_hash() == named.config_hash()
