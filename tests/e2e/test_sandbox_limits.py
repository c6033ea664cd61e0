"""Live-sandbox caps hold under concurrent creates; sandbox time is paid ahead by the
slice and a sandbox whose next slice cannot be paid is killed, never letting spend pass
the budget."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from kit.config import SandboxConfig, SandboxTemplate
from storage.store import Store
from tests.conftest import create_key, gym_config
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def _config(standin_url: str, **sandbox: Any) -> Any:
    config = gym_config(standin_url)
    config.sandbox = SandboxConfig(**sandbox)
    return config


def test_twenty_concurrent_creates_on_a_key_capped_at_five(make_gym: Any, store: Store, standin: Any) -> None:
    gym = make_gym(store=store, config=_config(standin[0]))
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        key = create_key(client, budget_usd=5.0, track="joint")  # the joint preset caps sandboxes at 5
        headers = {"X-API-Key": key["key"]}

        def create(_: int) -> httpx.Response:
            with httpx.Client(base_url=url, timeout=60) as c:
                return c.post("/sandbox/v2/sandboxes", json={"templateID": "base", "timeout": 120}, headers=headers)

        with ThreadPoolExecutor(20) as pool:
            responses = list(pool.map(create, range(20)))
        codes = sorted(r.status_code for r in responses)
        assert codes == [201] * 5 + [429] * 15, [r.text for r in responses if r.status_code not in (201, 429)]
        refused = next(r for r in responses if r.status_code == 429).json()
        assert refused["error"]["type"] == "concurrency_limit"
        live = client.get("/sandbox/v2/sandboxes", headers=headers).json()
        assert len(live) == 5
        # a slot comes back when a sandbox ends
        client.delete(f"/sandbox/sandboxes/{live[0]['sandboxID']}", headers=headers)
        again = client.post("/sandbox/v2/sandboxes", json={"templateID": "base"}, headers=headers)
        assert again.status_code == 201, again.text
        for s in client.get("/sandbox/v2/sandboxes", headers=headers).json():
            assert client.delete(f"/sandbox/sandboxes/{s['sandboxID']}", headers=headers).status_code == 204
        balance = client.get("/v1/balance", headers=headers).json()
        assert balance["reserved_usd"] == 0 and balance["spent_usd"] <= balance["budget_usd"]


def test_budget_for_ten_sandbox_seconds_kills_the_sandbox(make_gym: Any, standin: Any) -> None:
    # $0.36 per hour = $0.0001 per second: a $0.001 budget pays for exactly 10 sandbox-seconds
    config = _config(standin[0], slice_s=1.0, templates=[SandboxTemplate(name="base", usd_per_hour=0.36)])
    gym = make_gym(config=config)
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        key = create_key(client, budget_usd=0.001, track="joint")
        headers = {"X-API-Key": key["key"]}
        created = client.post("/sandbox/v2/sandboxes", json={"templateID": "base", "timeout": 600}, headers=headers)
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["sandboxID"]
        deadline = time.monotonic() + 30
        record: dict[str, Any] = {}
        while time.monotonic() < deadline:
            record = client.get(f"/sandbox/v1/sandboxes/{sandbox_id}", headers=headers).json()
            if record["state"] != "running":
                break
            time.sleep(0.25)
        print(f"\nbudget for 10 sandbox-seconds: ran {record['seconds']} s, cost ${record['cost_usd']}, "
              f"state {record['state']}")
        assert record["state"] == "budget_exhausted", record
        assert "budget" in record["end_reason"]
        # it ran what the budget paid for, less at most one slice — and not a moment unpaid
        assert 9.0 - 1.0 <= record["seconds"] <= 10.0, record
        balance = client.get("/v1/balance", headers=headers).json()
        assert balance["spent_usd"] <= balance["budget_usd"] == 0.001
        assert balance["reserved_usd"] == 0
        ledger = client.get(f"/admin/v1/keys/{key['id']}/ledger",
                            headers={"Authorization": "Bearer " + gym.admin_token}).json()["data"]
        assert {row["operation"] for row in ledger} == {"sandbox.seconds"}
        assert sum(row["actual_usd"] or 0 for row in ledger) == pytest.approx(balance["spent_usd"])
        # the sandbox is gone: E2B's own API says not found, with the reason
        gone = client.get(f"/sandbox/sandboxes/{sandbox_id}", headers=headers)
        assert gone.status_code == 404 and "budget_exhausted" in gone.json()["message"]
        # a key that cannot pay the first slice gets no sandbox at all
        refused = client.post("/sandbox/v2/sandboxes", json={"templateID": "base"}, headers=headers)
        assert refused.status_code == 402 and refused.json()["error"]["type"] == "budget_exhausted"
