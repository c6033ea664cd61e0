"""The warm pool (issue 14, item 4) must not trade isolation or metering for speed.

A pool sandbox is started before anyone asks for it, so the attacks are: an owner leaves
something behind (files, a process, its environment) hoping a later owner's "fresh" sandbox is
a recycled one; code inside a claimed sandbox asks the agent to configure it again (another
sandbox id, a door forward of its choosing); a pool sandbox is billed to somebody before it is
claimed, or lets a key past its live-sandbox cap because it was already running.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.conftest import create_key
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

SECRET = "owner-a-secret-3c9e"
RECONFIGURE = (
    "import json, socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/rsigym/agent.sock'); "
    "s.sendall(json.dumps({'op': 'configure', 'env': {'E2B_SANDBOX_ID': 'sbx_forged', 'OWNER': 'attacker'}, "
    "'forward': ['127.0.0.1:7000=/run/rsigym/agent.sock']}).encode() + b'\\n'); print(s.recv(4096).decode())"
)


@pytest.fixture
def env(gym: Any) -> Iterator[dict[str, Any]]:
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        backend = gym.service_apps["sandbox"].state.sandbox.backend
        assert backend.warm_pool == 2  # the default
        yield {"url": url, "client": client, "backend": backend}


def _opts(env: dict[str, Any], key: str) -> dict[str, Any]:
    return {"api_key": key, "api_url": f"{env['url']}/sandbox", "sandbox_url": f"{env['url']}/sandbox/envd"}


def _wait_warm(backend: Any, n: int = 2) -> None:
    deadline = time.monotonic() + 60
    while backend.warm_count() < n:
        assert time.monotonic() < deadline, f"the pool never held {n} sandboxes"
        time.sleep(0.05)


def _balance(env: dict[str, Any], key: str) -> dict[str, Any]:
    return dict(env["client"].get("/v1/balance", headers={"X-API-Key": key}).json())


def test_a_claimed_sandbox_never_saw_another_owner(env: dict[str, Any]) -> None:
    backend = env["backend"]
    a = create_key(env["client"], budget_usd=1.0)["key"]
    b = create_key(env["client"], budget_usd=1.0)["key"]
    # owner A's first create starts cold and wakes the pool for the template
    sa = Sandbox.create(template="base", timeout=120, envs={"OWNER": "a"}, **_opts(env, a))
    sa.commands.run(f"echo {SECRET} > /home/user/{SECRET}; echo {SECRET} > /tmp/{SECRET}")
    sa.commands.run(f"sleep 600 # {SECRET}", background=True)
    _wait_warm(backend)
    # nobody was billed for the two pool sandboxes: B has spent nothing, A nothing beyond its one sandbox
    assert _balance(env, b)["spent_usd"] == 0 and _balance(env, b)["reserved_usd"] == 0

    warm_before = backend.starts["warm"]
    seen: list[str] = []
    try:
        sb = Sandbox.create(template="base", timeout=120, envs={"OWNER": "b"}, **_opts(env, b))
        assert backend.starts["warm"] == warm_before + 1  # control: it came from the pool
        sa.kill()  # A's sandbox ends while B goes on creating: its uid and control dir are reused later
        fresh = [sb]
        for _ in range(4):
            _wait_warm(backend)
            fresh.append(Sandbox.create(template="base", timeout=120, envs={"OWNER": "b"}, **_opts(env, b)))
        assert backend.starts["warm"] == warm_before + 5
        for sbx in fresh:
            r = sbx.commands.run("ls -a /home/user /tmp; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; "
                                 "echo; echo id=$E2B_SANDBOX_ID owner=$OWNER")
            seen.append(r.stdout)
            assert SECRET not in r.stdout, r.stdout
            assert f"id={sbx.sandbox_id} owner=b" in r.stdout
        # the attack from inside: configure the agent again (another id, a forward of its own)
        r = sb.commands.run(f'python3 -c "{RECONFIGURE}"')
        answer = json.loads(r.stdout)
        assert answer["error"]["code"] == "failed_precondition", answer
        after = sb.commands.run("echo id=$E2B_SANDBOX_ID owner=$OWNER; "
                                "timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/7000' && echo OPEN || echo CLOSED")
        assert f"id={sb.sandbox_id} owner=b" in after.stdout and after.stdout.strip().endswith("CLOSED")
    finally:
        for sbx in env["client"].get("/sandbox/v2/sandboxes", headers={"X-API-Key": b}).json():
            env["client"].delete(f"/sandbox/sandboxes/{sbx['sandboxID']}", headers={"X-API-Key": b})
    # B paid for its five sandboxes only, from their claim: five ended records, nothing left reserved
    records = env["client"].get("/sandbox/v1/sandboxes", headers={"X-API-Key": b})
    ended = [r for r in records.json()["data"] if r["state"] != "running"]
    assert len(ended) == 5 and all(r["seconds"] < 60 for r in ended), ended
    balance = _balance(env, b)
    assert balance["reserved_usd"] == 0 and 0 < balance["spent_usd"] <= sum(r["cost_usd"] for r in ended) + 1e-9


def test_a_warm_pool_does_not_let_a_key_past_its_live_sandbox_cap(env: dict[str, Any]) -> None:
    backend = env["backend"]
    client = env["client"]
    parent = create_key(client, budget_usd=1.0)["key"]
    r = client.post("/v1/keys", headers={"Authorization": f"Bearer {parent}"},
                    json={"name": "one-sandbox", "policy": {"services": {"sandbox": {"max_concurrency": 1}}}})
    assert r.status_code == 201, r.text
    child = {"X-API-Key": r.json()["key"]}
    first = client.post("/sandbox/v2/sandboxes", json={"templateID": "base", "timeout": 60}, headers=child)
    assert first.status_code == 201, first.text
    _wait_warm(backend)
    warm, started = backend.warm_count(), dict(backend.starts)
    refused = client.post("/sandbox/v2/sandboxes", json={"templateID": "base", "timeout": 60}, headers=child)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "concurrency_limit"
    # the refused create took nothing from the pool and started nothing
    assert backend.warm_count() == warm and backend.starts == started
    assert client.delete(f"/sandbox/sandboxes/{first.json()['sandboxID']}", headers=child).status_code == 204
    again = client.post("/sandbox/v2/sandboxes", json={"templateID": "base", "timeout": 60}, headers=child)
    assert again.status_code == 201 and backend.starts["warm"] == started["warm"] + 1
    client.delete(f"/sandbox/sandboxes/{again.json()['sandboxID']}", headers=child)
