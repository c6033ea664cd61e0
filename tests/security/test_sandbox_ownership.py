"""A sandbox belongs to the key that made it, not to every key of the run (security issue, item 5).

The attack: ownership was checked per run, so any child key with the sandbox grant (a worker, a
reviewer) could list, read, exec into and kill sandboxes it did not create — evaluation trial
sandboxes and their model doors included. Now a sandbox is reachable by its creator key and that
key's ancestors; a trial's sandbox (made with the evaluation job's platform key) by that key alone.
"""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException
from sqlalchemy import select

from services.sandbox.tables import SandboxRow
from tests.fakes.live_gym import LiveGym, harness_archive


def _child(live: LiveGym, parent: dict[str, str], name: str) -> str:
    r = httpx.post(f"{live.url}/v1/keys", headers={"Authorization": f"Bearer {parent['key']}"},
                   json={"name": name, "policy": {"services": {"sandbox": {"max_concurrency": 2}}}})
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


def _reach(live: LiveGym, key: str, sandbox_id: str) -> dict[str, int]:
    """What ``key`` gets for every way to touch the sandbox (status codes)."""
    h = {"X-API-Key": key}
    base = f"{live.url}/sandbox"
    listed = httpx.get(f"{base}/v2/sandboxes", headers=h).json()
    records = httpx.get(f"{base}/v1/sandboxes", headers=h).json()["data"]
    return {
        "get": httpx.get(f"{base}/sandboxes/{sandbox_id}", headers=h).status_code,
        "connect": httpx.post(f"{base}/v2/sandboxes/{sandbox_id}/connect", json={"timeout": 60}, headers=h).status_code,
        "record": httpx.get(f"{base}/v1/sandboxes/{sandbox_id}", headers=h).status_code,
        "timeout": httpx.post(f"{base}/sandboxes/{sandbox_id}/timeout", json={"timeout": 60}, headers=h).status_code,
        "listed": int(any(s["sandboxID"] == sandbox_id for s in listed)),
        "in_records": int(any(r["id"] == sandbox_id for r in records)),
        "files": httpx.get(f"{base}/envd/files", params={"path": "/etc/hostname"},
                           headers={**h, "E2b-Sandbox-Id": sandbox_id}).status_code,
    }


NOTHING = {"get": 404, "connect": 404, "record": 404, "timeout": 404, "listed": 0, "in_records": 0, "files": 404}


def test_a_sibling_key_cannot_reach_a_workers_sandbox(live: LiveGym) -> None:
    run = live.key()
    worker, reviewer = _child(live, run, "worker"), _child(live, run, "reviewer")
    opts = {"api_url": f"{live.url}/sandbox", "sandbox_url": f"{live.url}/sandbox/envd"}
    sbx = Sandbox.create(template="base", timeout=120, api_key=worker, **opts)
    try:
        sbx.files.write("/home/user/notes.txt", "the worker's notes")
        assert _reach(live, reviewer, sbx.sandbox_id) == NOTHING
        with pytest.raises(NotFoundException):  # the e2b SDK, as the reviewer, finds no such sandbox
            Sandbox.connect(sbx.sandbox_id, api_key=reviewer, **opts)
        assert httpx.delete(f"{live.url}/sandbox/sandboxes/{sbx.sandbox_id}",
                            headers={"X-API-Key": reviewer}).status_code == 404
        # The sandbox is untouched, and its creator and the run's root key still reach it.
        assert sbx.files.read("/home/user/notes.txt") == "the worker's notes"
        for owner in (worker, run["key"]):
            seen = _reach(live, owner, sbx.sandbox_id)
            assert seen["get"] == 200 and seen["listed"] == 1 and seen["files"] == 200, seen
    finally:
        sbx.kill()



def test_a_killed_sandbox_is_out_of_reach_of_its_owner_too(live: LiveGym) -> None:
    """Who may reach a running sandbox is answered from the serving replica's memory
    (services/sandbox/service.py, ``check_owned``); a sandbox taken out of it by a kill is answered
    from its row: not found, and to its owner only, why."""
    run = live.key()
    worker, reviewer = _child(live, run, "worker"), _child(live, run, "reviewer")
    opts = {"api_url": f"{live.url}/sandbox", "sandbox_url": f"{live.url}/sandbox/envd"}
    sbx = Sandbox.create(template="base", timeout=120, api_key=worker, **opts)
    sbx.kill()
    for key, told in ((worker, True), (reviewer, False)):
        r = httpx.get(f"{live.url}/sandbox/envd/files", params={"path": "/etc/hostname"},
                      headers={"X-API-Key": key, "E2b-Sandbox-Id": sbx.sandbox_id})
        assert r.status_code == 404 and ("it ended: killed" in r.text) is told, r.text

def test_no_key_of_the_run_reaches_an_evaluation_trials_sandbox(live: LiveGym) -> None:
    run = live.key(track="harness")
    agent = live.agent(run)
    slow = harness_archive("slow", "echo 0 > /app/answer.txt\nsleep 20\n")
    harness = agent.post("/evaluation/v1/harnesses", content=slow).json()["id"]
    job = agent.post("/evaluation/v1/jobs", json={"benchmark": "mini", "split": "dev", "model": "tiny",
                                                  "harness": harness, "limit": 1}).json()
    store = live.gym.gateway.store
    deadline, trial_sandboxes = time.monotonic() + 120, []
    while not trial_sandboxes and time.monotonic() < deadline:
        with store.transaction() as s:
            trial_sandboxes = list(s.scalars(select(SandboxRow.id).where(
                SandboxRow.run_id == run["id"], SandboxRow.state == "running", SandboxRow.key_id != run["id"])))
        time.sleep(0.2)
    assert trial_sandboxes, "the trial's sandbox never started"
    child = _child(live, run, "worker")
    for key in (run["key"], child):  # the run's root key included
        for sandbox_id in trial_sandboxes:
            assert _reach(live, key, sandbox_id) == NOTHING
            assert httpx.delete(f"{live.url}/sandbox/sandboxes/{sandbox_id}",
                                headers={"X-API-Key": key}).status_code == 404
    done = live.wait_job(agent, job["id"])
    assert done["status"] == "succeeded" and done["progress"] == {"done": 1, "total": 1}, done
    [result] = agent.get(f"/evaluation/v1/jobs/{job['id']}/results").json()["data"]
    assert result["error"] is None and result["reward"] == 0.0  # the trial ran to its end, unharmed
