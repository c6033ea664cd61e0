"""Distributed mode: the same gateway code in front of a rollout service run as its own
server, over real HTTP; the service refuses anyone but the gateway."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit.settings import GymSettings, StoreSettings
from ops.builder import build_gateway, build_service
from tests.conftest import ADMIN_TOKEN, TEACHER_ENV, admin_headers, bearer, gym_config
from tests.fakes.servers import free_port, serve


def test_gateway_and_service_as_separate_servers(tmp_path: Path, standin: Any, teacher_secret: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEACHER_ENV, teacher_secret)
    port = free_port()
    settings = GymSettings(data_dir=tmp_path, admin_token=ADMIN_TOKEN, internal_secret="shared-internal-secret",
                           gateway_url=f"http://127.0.0.1:{port}")
    config = gym_config(standin[0])
    with serve(build_service("rollout", settings, config)) as rollout_url:
        gym = build_gateway(settings, StoreSettings(), {"rollout": rollout_url}, config)
        with serve(gym.app, port=port) as url, httpx.Client(base_url=url, timeout=60) as client:
            created = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1}, headers=admin_headers()).json()
            body = {"model": "teacher", "messages": [{"role": "user", "content": "What is 9 + 9?"}], "max_tokens": 4}
            r = client.post("/rollout/v1/chat/completions", json=body, headers=bearer(created["key"]))
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "18"
            with client.stream("POST", "/rollout/v1/chat/completions", json={**body, "stream": True},
                               headers=bearer(created["key"])) as s:
                text = s.read().decode()
            assert "data: [DONE]" in text and "rsigym-cost" not in text
            rows = client.get(f"/admin/v1/keys/{created['id']}/ledger", headers=admin_headers()).json()["data"]
            assert [row["status"] for row in rows] == ["settled", "settled"]
            # Straight to the service, even with a valid run key, is refused.
            direct = httpx.post(f"{rollout_url}/v1/chat/completions", json=body, headers=bearer(created["key"]))
            assert direct.status_code == 401
    with pytest.raises(SystemExit):
        build_service("rollout", GymSettings(data_dir=tmp_path), config)


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="needs bubblewrap")
def test_sandbox_service_as_its_own_server(tmp_path: Path, standin: Any) -> None:
    """The unmodified e2b SDK through a gateway that forwards to a separately served sandbox
    service; the service's daemon routes refuse a direct call, access token or not."""
    from e2b import Sandbox

    port = free_port()
    settings = GymSettings(data_dir=tmp_path, admin_token=ADMIN_TOKEN, internal_secret="shared-internal-secret",
                           gateway_url=f"http://127.0.0.1:{port}")
    config = gym_config(standin[0])
    service = build_service("sandbox", settings, config)
    try:
        with serve(service) as sandbox_url:
            gym = build_gateway(settings, StoreSettings(), {"sandbox": sandbox_url}, config)
            with serve(gym.app, port=port) as url, httpx.Client(base_url=url, timeout=60) as client:
                key = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1},
                                  headers=admin_headers()).json()["key"]
                sbx = Sandbox.create(template="base", timeout=60, api_key=key, api_url=f"{url}/sandbox",
                                     sandbox_url=f"{url}/sandbox/envd")
                try:
                    assert sbx.commands.run("echo distributed").stdout.strip() == "distributed"
                    direct = httpx.get(f"{sandbox_url}/envd/files", params={"path": "/etc/hostname"},
                                       headers={"X-Access-Token": "anything", "E2b-Sandbox-Id": sbx.sandbox_id})
                    assert direct.status_code == 401
                finally:
                    sbx.kill()
    finally:
        service.state.close()


def test_records_service_as_its_own_server(tmp_path: Path, standin: Any) -> None:
    """The records service behind a gateway over real HTTP: an agent records an experiment, a
    refused call lands in the run's chain (written by the gateway into the shared store), the
    operator audits the run through the admin API; a direct call to the service is refused."""
    port = free_port()
    settings = GymSettings(data_dir=tmp_path, admin_token=ADMIN_TOKEN, internal_secret="shared-internal-secret",
                           gateway_url=f"http://127.0.0.1:{port}")
    config = gym_config(standin[0])
    with serve(build_service("records", settings, config)) as records_url:
        gym = build_gateway(settings, StoreSettings(), {"records": records_url}, config)
        with serve(gym.app, port=port) as url, httpx.Client(base_url=url, timeout=120) as client:
            run = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1}, headers=admin_headers()).json()
            made = client.post("/records/v1/experiments", json={"name": "baseline", "parents": []},
                               headers=bearer(run["key"]))
            assert made.status_code == 201, made.text
            listed = client.get("/records/v1/experiments", headers=bearer(run["key"])).json()["data"]
            assert [e["id"] for e in listed] == [made.json()["id"]]
            refused = client.post("/records/v1/annotations", json={"kind": "finding", "claim": "x",
                                                                    "experiment_ids": ["exp_nope"]},
                                  headers=bearer(run["key"]))
            assert refused.status_code in (404, 422)
            minted = client.post("/v1/keys", json={"name": "w", "policy": {"services": {"rollout": {"max_concurrency": 1}}}},
                                 headers=bearer(run["key"]))
            assert minted.status_code == 201, minted.text
            child = minted.json()
            denied = client.get("/records/v1/events", headers=bearer(child["key"]))
            assert denied.status_code == 403  # the child is not granted records
            kinds = [e["kind"] for e in client.get(f"/admin/v1/runs/{run['id']}/events",
                                                   headers=admin_headers()).json()["data"]]
            assert kinds == ["experiment.created", "call.refused"]
            audit = client.post(f"/admin/v1/runs/{run['id']}/audit", json={}, headers=admin_headers())
            assert audit.status_code == 200, audit.text
            assert audit.json()["run_id"] == run["id"] and audit.json()["status"] in ("accepted", "flagged")
            chain = client.get(f"/admin/v1/runs/{run['id']}/chain", headers=admin_headers()).json()
            assert chain["ok"] is True and chain["events"] == 3  # … and the audit's own result
            direct = httpx.get(f"{records_url}/v1/events", headers=bearer(run["key"]))
            assert direct.status_code == 401


def test_healthz_names_a_service_that_cannot_be_reached_and_answers_503(tmp_path: Path, standin: Any) -> None:
    """/healthz asks each service run as its own server for its own health: with records served and
    rollout's URL on a closed port, it answers 503 naming rollout, down, and why (it used to say
    ``ok`` and list every linked service, reachable or not). When rollout comes up, it answers 200."""
    port = free_port()
    settings = GymSettings(data_dir=tmp_path, admin_token=ADMIN_TOKEN, internal_secret="shared-internal-secret",
                           gateway_url=f"http://127.0.0.1:{port}")
    config = gym_config(standin[0])
    rollout_port = free_port()  # nothing listens there (yet)
    with serve(build_service("records", settings, config)) as records_url:
        gym = build_gateway(settings, StoreSettings(),
                            {"records": records_url, "rollout": f"http://127.0.0.1:{rollout_port}"}, config)
        with serve(gym.app, port=port) as url:
            r = httpx.get(f"{url}/healthz", timeout=10)
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["status"] == "degraded" and body["store"] == "ok"
            assert body["services"]["records"] == {"status": "ok"}
            assert body["services"]["rollout"]["status"] == "down"
            assert f"127.0.0.1:{rollout_port}" in body["services"]["rollout"]["reason"]
            with serve(build_service("rollout", settings, config), port=rollout_port):
                time.sleep(1.6)  # past the report's reuse (it is polled: probed at most every 1.5 s)
                r = httpx.get(f"{url}/healthz", timeout=10)
                assert r.status_code == 200, r.text
                assert r.json()["services"] == {"records": {"status": "ok"}, "rollout": {"status": "ok"}}
