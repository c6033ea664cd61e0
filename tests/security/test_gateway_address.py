"""No platform credential goes where a request says (security issue, item 1).

The attack: with ``RSIGYM_GATEWAY_URL`` unset, the address evaluation trials and sandbox doors
call back to was taken from the caller's ``Host``. An agent that created a job with
``Host: 127.0.0.1:<its listener>`` received the platform-minted sandbox key (with the door
grant) and the door key on its listener. Now the gym calls back only to the address it knows
itself (where ``rsigym up`` listens, or the configured URL), distributed mode will not start
without one, and a door's key must belong to the run that opens it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from access.keys import KeyRegistry
from access.policy import Policy
from kit.settings import GymSettings, StoreSettings
from ops.builder import build_gateway, build_service
from tests.conftest import ADMIN_TOKEN, gym_config
from tests.fakes.live_gym import LiveGym, harness_archive, mini_benchmark


class Listener:
    """The attacker's HTTP listener on loopback: records every request it gets."""

    def __init__(self) -> None:
        seen: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                             "body": self.rfile.read(length)[:2000].decode(errors="replace")})
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = do_PUT = do_DELETE = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.seen = seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    spy = Listener()
    yield spy
    spy.close()


def forged(port: int) -> list[dict[str, str]]:
    here = f"127.0.0.1:{port}"
    return [{"Host": here},
            {"X-Forwarded-Host": here, "X-Forwarded-Proto": "http", "X-Forwarded-Port": str(port)},
            {"Forwarded": f"for=127.0.0.1;host={here};proto=http"},
            {"Host": here, "X-Forwarded-Host": here, "Forwarded": f"host={here}"}]


def test_forged_host_headers_send_nothing_to_the_attacker(live: LiveGym, listener: Listener,
                                                         tmp_path: Path) -> None:
    key = live.key(track="harness")
    run_key = key["key"]
    agent = live.agent(key)
    harness = agent.post("/evaluation/v1/harnesses", content=harness_archive("honest", "echo 0 > /app/answer.txt\n"))
    assert harness.status_code == 201, harness.text
    jobs = []
    for headers in forged(listener.port):
        for path in ("/sandbox/sandboxes", "/sandbox/v2/sandboxes"):
            r = agent.post(path, json={"templateID": "base", "timeout": 60}, headers={**headers, "X-API-Key": run_key})
            assert r.status_code == 201, r.text
            killed = agent.delete(f"/sandbox/sandboxes/{r.json()['sandboxID']}", headers={"X-API-Key": run_key})
            assert killed.status_code == 204
        r = agent.post("/evaluation/v1/jobs", headers=headers, json={
            "benchmark": "mini", "split": "dev", "model": "tiny", "harness": harness.json()["id"]})
        assert r.status_code in (200, 201), r.text
        jobs.append(r.json()["id"])
    for job_id in jobs:  # the jobs ran, calling back to the gym itself
        job = live.wait_job(agent, job_id)
        assert job["status"] == "succeeded" and job["progress"] == {"done": 2, "total": 2}, job
        results = agent.get(f"/evaluation/v1/jobs/{job_id}/results").json()["data"]
        assert all(r["error"] is None for r in results), results
    # The operator's routes that start evaluations, with the same forgeries (scoring ends the run: last).
    registered = live.register(mini_benchmark(tmp_path, name="mini-forged"), **forged(listener.port)[0])
    assert registered["status"] == "ready", registered
    assert agent.post("/evaluation/v1/submissions", json={"harness": harness.json()["id"]}).status_code == 201
    for headers in forged(listener.port)[:1]:
        r = live.http.post(f"/admin/v1/runs/{key['id']}/score", json={"attempts": 1, "benchmarks": ["mini"]},
                           headers=headers)
        assert r.status_code == 202, r.text
    live.wait_scores("mini", {key["id"]})
    assert listener.seen == [], f"the attacker's listener got {len(listener.seen)} requests: {listener.seen[:2]}"


def test_distributed_mode_refuses_to_start_without_its_own_address(tmp_path: Path, standin: Any) -> None:
    settings = GymSettings(data_dir=tmp_path, admin_token=ADMIN_TOKEN, internal_secret="shared-internal-secret")
    config = gym_config(standin[0])
    with pytest.raises(SystemExit, match="RSIGYM_GATEWAY_URL"):
        build_gateway(settings, StoreSettings(), {"rollout": "http://127.0.0.1:9"}, config)
    for part in ("sandbox", "evaluation", "rollout"):
        with pytest.raises(SystemExit, match="RSIGYM_GATEWAY_URL"):
            build_service(part, settings, config)
    with pytest.raises(ValueError, match="RSIGYM_GATEWAY_URL"):
        GymSettings(data_dir=tmp_path, gateway_url="http://user:pw@127.0.0.1:8700?x=1")


def test_a_door_carries_only_a_key_of_its_own_run_to_the_gym_itself(live: LiveGym, listener: Listener) -> None:
    registry = KeyRegistry(live.gym.gateway.store)
    run, other = live.key(), live.key()
    door_grant = Policy.model_validate({"services": {"sandbox": {"door": True, "internet": False, "max_concurrency": 2}}})
    _, sandbox_key = registry.create(policy=door_grant, budget_nusd=None, parent_id=run["id"], platform=True)
    _, own_door = registry.create(policy=Policy.model_validate({"services": {"inference": {
        "models": ["tiny"], "max_concurrency": 2}}}), budget_nusd=None, parent_id=run["id"], platform=True)
    create = f"{live.url}/sandbox/v2/sandboxes"
    for foreign in (other["key"], "rsk-made-up-key-0000000000000000", ADMIN_TOKEN):
        r = httpx.post(create, json={"timeout": 60, "rsigymDoor": {"key": foreign}}, headers={"X-API-Key": sandbox_key})
        assert r.status_code == 403 and r.json()["error"]["param"] == "rsigymDoor.key", r.text
    r = httpx.post(create, json={"timeout": 60, "rsigymDoor": {"key": own_door}}, headers={"X-API-Key": sandbox_key})
    assert r.status_code == 201, r.text
    door = r.json()["rsigymDoorUrl"]
    sbx = Sandbox.connect(r.json()["sandboxID"], api_key=sandbox_key, api_url=f"{live.url}/sandbox",
                          sandbox_url=f"{live.url}/sandbox/envd")
    try:
        here = f"127.0.0.1:{listener.port}"
        probe = (f"curl -s -o /dev/null -w '%{{http_code}} ' -H 'Host: {here}' -H 'X-Forwarded-Host: {here}' "
                 f"{door}/models; "
                 f"curl -s -o /dev/null -w '%{{http_code}} ' --request-target 'http://{here}/inference/v1/models' "
                 f"{door}/models; "
                 f"curl -s -o /dev/null -w '%{{http_code}}' {door}/%2e%2e/%2e%2e/rollout/v1/models")
        codes = sbx.commands.run(probe, timeout=60).stdout.split()
        assert codes == ["200", "403", "403"], codes  # the gym's inference; nothing else, nowhere else
    finally:
        sbx.kill()
    assert listener.seen == []
