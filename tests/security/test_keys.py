"""Keys: stored only hashed, refused once revoked or paused (children too), scoped to their run."""

from __future__ import annotations

from typing import Any

from sqlalchemy import MetaData, select

from tests.conftest import admin_headers, bearer, client_for, create_key

CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4}


def _chat(client: Any, key: str, **body: Any) -> Any:
    return client.post("/rollout/v1/chat/completions", json={**CHAT, **body}, headers=bearer(key))


def test_database_holds_no_plaintext_key(gym: Any) -> None:
    client = client_for(gym)
    created = create_key(client, 1.0)
    child = client.post("/v1/keys", json={"name": "worker"}, headers=bearer(created["key"])).json()
    plaintexts = [created["key"], child["key"]]
    meta = MetaData()
    meta.reflect(gym.gateway.store.engine)
    with gym.gateway.store.engine.connect() as conn:
        dump = " ".join(str(row) for table in meta.sorted_tables for row in conn.execute(select(table)))
    for key in plaintexts:
        assert key not in dump and key[4:] not in dump
    db_file = gym.gateway.store.url.removeprefix("sqlite:///")
    raw = open(db_file, "rb").read() + open(db_file + "-wal", "rb").read()
    assert not any(key.encode() in raw for key in plaintexts)
    listed = client.get("/admin/v1/keys", headers=admin_headers()).json()["data"]
    assert all("key" not in row and "key_hash" not in row for row in listed)


def test_revoked_and_paused_keys_are_refused_on_the_next_call(gym: Any) -> None:
    client = client_for(gym)
    created = create_key(client, 1.0)
    key, kid = created["key"], created["id"]
    child = client.post("/v1/keys", json={"name": "reviewer"}, headers=bearer(key)).json()["key"]
    assert _chat(client, key).status_code == 200 and _chat(client, child).status_code == 200

    assert client.post(f"/admin/v1/keys/{kid}/pause", headers=admin_headers()).json()["status"] == "paused"
    for k in (key, child):
        r = _chat(client, k)
        assert r.status_code == 403 and r.json()["error"]["type"] == "key_paused"
        assert client.get("/v1/balance", headers=bearer(k)).status_code == 403
    client.post(f"/admin/v1/keys/{kid}/resume", headers=admin_headers())
    assert _chat(client, child).status_code == 200

    client.post(f"/admin/v1/keys/{kid}/revoke", headers=admin_headers())
    for k in (key, child):
        r = _chat(client, k)
        assert r.status_code == 401 and r.json()["error"]["type"] == "key_revoked"
    r = client.post(f"/admin/v1/keys/{kid}/resume", headers=admin_headers())
    assert r.status_code == 409


def test_a_run_can_revoke_its_own_child_but_not_another_runs_key(gym: Any) -> None:
    client = client_for(gym)
    a, b = create_key(client, 1.0), create_key(client, 1.0)
    child = client.post("/v1/keys", json={}, headers=bearer(a["key"])).json()
    r = client.post(f"/v1/keys/{b['id']}/revoke", headers=bearer(a["key"]))
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    assert _chat(client, b["key"]).status_code == 200
    assert client.post(f"/v1/keys/{child['id']}/revoke", headers=bearer(a["key"])).json()["status"] == "revoked"
    assert _chat(client, child["key"]).status_code == 401
    assert _chat(client, a["key"]).status_code == 200


def test_bad_credentials_get_401_in_the_standard_shape(gym: Any) -> None:
    client = client_for(gym)
    for headers in ({}, bearer("rsk-nope"), {"Authorization": "Basic abc"}):
        r = client.post("/rollout/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 401
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
        assert body["request_id"] == r.headers["X-Request-Id"]
    run_key = create_key(client, 1.0)["key"]
    assert client.get("/admin/v1/keys", headers=bearer(run_key)).status_code == 401
    assert client.get("/admin/v1/keys").status_code == 401


def test_child_keys_are_narrower_and_share_the_parent_budget(gym: Any) -> None:
    client = client_for(gym)
    # A run granted rollout and inference but not training (no track preset is exactly that).
    parent = create_key(client, 1.0, track=None, policy={"services": {"rollout": {"max_concurrency": 16},
                                                                      "inference": {"max_concurrency": 16}}})
    r = client.post("/v1/keys", json={"policy": {"services": {"training": {}}}}, headers=bearer(parent["key"]))
    assert r.status_code == 403 and r.json()["error"]["param"] == "services.training"
    narrow = {"services": {"rollout": {"models": ["teacher"], "max_concurrency": 2}}}
    # A CHAT call reserves 0.000097 USD (its upper bound) and costs ~0.000017: this covers two.
    child = client.post("/v1/keys", json={"policy": narrow, "budget_usd": 0.00012}, headers=bearer(parent["key"])).json()
    r = _chat(client, child["key"], model="judge")
    assert r.status_code == 403 and r.json()["error"]["param"] == "model"
    models = client.get("/rollout/v1/models", headers=bearer(child["key"])).json()["data"]
    assert [m["id"] for m in models] == ["teacher"]
    assert _chat(client, child["key"]).status_code == 200
    # The sub-budget runs out long before the parent's.
    statuses = [_chat(client, child["key"]).status_code for _ in range(3)]
    assert 402 in statuses
    parent_balance = client.get("/v1/balance", headers=bearer(parent["key"])).json()
    child_balance = client.get("/v1/balance", headers=bearer(child["key"])).json()
    assert parent_balance["spent_usd"] >= child_balance["spent_usd"] > 0
    assert child_balance["spent_usd"] <= 0.00012
    rows = client.get(f"/admin/v1/keys/{parent['id']}/ledger", headers=admin_headers()).json()["data"]
    assert {r["key_id"] for r in rows} == {child["id"]}


def test_a_child_that_leaves_a_cap_out_inherits_the_parents(gym: Any) -> None:
    """The agent guide's child-key example, verbatim, under a track whose preset caps rollout
    concurrency: minted with the parent's cap (it was refused for not stating one); a cap above
    the parent's is still refused, one below it kept."""
    client = client_for(gym)
    run = create_key(client, 1.0)  # the joint preset: rollout max_concurrency set
    capped = {s: p.get("max_concurrency") for s, p in run["policy"]["services"].items()}
    assert capped["rollout"] is not None
    r = client.post("/v1/keys", json={"name": "reviewer", "budget_usd": 0.5,
                                      "policy": {"services": {"rollout": {"models": ["teacher"]}}}},
                    headers=bearer(run["key"]))
    assert r.status_code == 201, r.text
    assert r.json()["policy"]["services"]["rollout"]["max_concurrency"] == capped["rollout"]
    assert _chat(client, r.json()["key"]).status_code == 200
    wider = {"services": {"rollout": {"models": ["teacher"], "max_concurrency": capped["rollout"] + 1}}}
    r = client.post("/v1/keys", json={"policy": wider}, headers=bearer(run["key"]))
    assert r.status_code == 403 and r.json()["error"]["param"] == "services.rollout.max_concurrency"
    narrower = {"services": {"rollout": {"models": ["teacher"], "max_concurrency": 1}}}
    r = client.post("/v1/keys", json={"policy": narrower}, headers=bearer(run["key"]))
    assert r.status_code == 201 and r.json()["policy"]["services"]["rollout"]["max_concurrency"] == 1


def test_fixed_policy_fields_are_filled_and_cannot_be_overridden(gym: Any, standin: Any) -> None:
    client = client_for(gym)
    policy = {"services": {"rollout": {"fields": {"temperature": {"fixed": 0.0}, "max_tokens": {"range": [1, 16]}}}}}
    key = client.post("/admin/v1/keys", json={"policy": policy, "budget_usd": 1}, headers=admin_headers()).json()["key"]
    assert _chat(client, key).status_code == 200
    assert standin[1].state.requests[-1]["temperature"] == 0.0
    for override, param in (({"temperature": 0.7}, "temperature"), ({"temperature": "0.0"}, "temperature"),
                            ({"max_tokens": 64}, "max_tokens"), ({"max_tokens": True}, "max_tokens")):
        r = _chat(client, key, **override)
        assert r.status_code == 403, override
        assert r.json()["error"] == {"type": "permission_denied", "param": param, "message": r.json()["error"]["message"]}


def test_admin_can_top_up_and_edit_policy(gym: Any) -> None:
    client = client_for(gym)
    created = create_key(client, 0.000001)
    assert _chat(client, created["key"]).status_code == 402
    r = client.post(f"/admin/v1/keys/{created['id']}/topup", json={"amount_usd": 1.0}, headers=admin_headers())
    assert r.json()["budget_usd"] == 1.000001
    assert _chat(client, created["key"]).status_code == 200
    r = client.patch(f"/admin/v1/keys/{created['id']}", json={"policy": {"services": {"sandbox": {}}}}, headers=admin_headers())
    assert r.status_code == 200
    r = _chat(client, created["key"])
    assert r.status_code == 403 and r.json()["error"]["param"] == "rollout"
    bad = client.patch(f"/admin/v1/keys/{created['id']}", json={"policy": {"services": {"x": {"modles": []}}}}, headers=admin_headers())
    assert bad.status_code == 422 and bad.json()["error"]["param"].startswith("policy.")
    for amount in (-1, 0, "NaN"):
        r = client.post(f"/admin/v1/keys/{created['id']}/topup", json={"amount_usd": amount}, headers=admin_headers())
        assert r.status_code == 422
