"""The two platform-only grants — a sandbox's model door and cross-run checkpoint use — can be
neither minted by an agent nor used by a key the platform did not mint."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import bearer, client_for, create_key


@pytest.mark.parametrize("service, rules", [
    ("sandbox", {"door": True, "max_concurrency": 1}),
    ("inference", {"models": ["ckpt_someone_elses"], "cross_run": True, "max_concurrency": 1}),
])
def test_an_agent_cannot_mint_a_platform_grant(gym: Any, service: str, rules: dict[str, Any]) -> None:
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0)
    r = client.post("/v1/keys", json={"name": "sneaky", "policy": {"services": {service: rules}}},
                    headers=bearer(run["key"]))
    assert r.status_code == 403, r.text
    assert r.json()["error"]["type"] == "permission_denied"
    assert "platform" in r.json()["error"]["message"]


def test_a_plain_key_cannot_open_a_model_door(gym: Any) -> None:
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0)
    r = client.post("/sandbox/v2/sandboxes", json={"templateID": "base", "rsigymDoor": {"key": "rsk-" + "x" * 43}},
                    headers={"X-API-Key": run["key"]})
    assert r.status_code == 403, r.text
    assert r.json()["error"]["param"] == "rsigymDoor"
    assert client.get("/sandbox/v2/sandboxes", headers={"X-API-Key": run["key"]}).json() == []
    assert client.get("/v1/balance", headers=bearer(run["key"])).json()["reserved_usd"] == 0


@pytest.mark.parametrize("body, param", [
    ({"templateID": "no-such-template"}, "templateID"),
    ({"templateID": "base", "timeout": 10 ** 9}, "timeout"),
    ({"templateID": "base", "unknownField": 1}, "unknownField"),
    ({"templateID": "base", "allow_internet_access": True}, "allow_internet_access"),
])
def test_bad_sandbox_requests_get_a_clear_error_and_hold_nothing(gym: Any, body: dict[str, Any], param: str) -> None:
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0)
    r = client.post("/sandbox/v2/sandboxes", json=body, headers={"X-API-Key": run["key"]})
    assert r.status_code in (403, 404, 422), r.text  # 422: the one status of a body that fails validation
    err = r.json()
    assert err["type"] == "error" and param in (err["error"]["param"] or "") and err["message"]
    balance = client.get("/v1/balance", headers=bearer(run["key"])).json()
    assert balance["reserved_usd"] == 0 and balance["spent_usd"] == 0
    assert client.get("/sandbox/v2/sandboxes", headers={"X-API-Key": run["key"]}).json() == []
