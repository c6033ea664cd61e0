"""``GET /v1/key``: a run key (or a child) reads its own track, deadline and policies — and
nothing of its parent's secrets or siblings."""

from __future__ import annotations

from typing import Any

from tests.conftest import admin_headers, bearer, client_for


def test_a_key_reads_its_own_track_policies_and_deadline(gym: Any) -> None:
    client = client_for(gym)
    run = client.post("/admin/v1/keys", headers=admin_headers(),
                      json={"track": "harness", "budget_usd": 2.0, "deadline_s": 3600}).json()
    mine = client.get("/v1/key", headers=bearer(run["key"]))
    assert mine.status_code == 200, mine.text
    body = mine.json()
    assert body["id"] == run["id"] and body["run_id"] == run["id"] and body["track"] == "harness"
    assert body["ends_at"] and body["budget_usd"] == 2.0 and body["remaining_usd"] == 2.0
    [root_policy] = body["effective_policies"]
    assert "training" not in root_policy["services"] and "rollout" not in root_policy["services"]
    assert "evaluation" in root_policy["services"]
    assert "key" not in body and "key_hash" not in body and not any("hash" in k for k in body)

    narrower = {"services": {"evaluation": {**root_policy["services"]["evaluation"], "max_concurrency": 1}}}
    minted = client.post("/v1/keys", headers=bearer(run["key"]),
                         json={"name": "reviewer", "budget_usd": 0.5, "policy": narrower})
    assert minted.status_code == 201, minted.text
    child = minted.json()
    seen = client.get("/v1/key", headers=bearer(child["key"])).json()
    assert seen["id"] == child["id"] and seen["parent_id"] == run["id"] and seen["run_id"] == run["id"]
    assert len(seen["effective_policies"]) == 2  # the run's and its own: a call must satisfy both
    assert list(seen["effective_policies"][1]["services"]) == ["evaluation"]

    assert client.get("/v1/key").status_code == 401
    client.post(f"/v1/keys/{child['id']}/revoke", headers=bearer(run["key"]))
    revoked = client.get("/v1/key", headers=bearer(child["key"]))
    assert revoked.status_code == 401 and revoked.json()["error"]["type"] == "key_revoked"
