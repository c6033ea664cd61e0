"""One access-log line per request (issue 16, item 5): request id, key id, route, status, cost,
latency — as text or JSON — and never a secret, whatever the caller puts where."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest

from kit.config import LoggingConfig
from ops.builder import Gym
from tests.conftest import ADMIN_TOKEN, admin_headers, bearer, client_for, create_key, gym_config


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_request_is_one_line_with_its_key_cost_and_no_secret(
        make_gym: Callable[..., Gym], standin: tuple[str, str], caplog: pytest.LogCaptureFixture, fmt: str) -> None:
    config = gym_config(standin[0])
    client = client_for(make_gym(config=config.model_copy(update={"logging": LoggingConfig(access=fmt)})))  # type: ignore[arg-type]
    run = create_key(client, 1.0)
    chat = {"model": "teacher", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4}
    with caplog.at_level(logging.INFO, logger="rsigym.access"):
        ok = client.post(f"/rollout/v1/chat/completions?api_key={run['key']}", json=chat, headers=bearer(run["key"]))
        refused = client.post("/rollout/v1/chat/completions", json={**chat, "model": "nope"}, headers=bearer(run["key"]))
        bad = client.get("/v1/balance", headers=bearer("rsk-not-a-real-key-but-secret-looking"))
        admin = client.get("/admin/v1/keys", headers=admin_headers())
    lines = [r.getMessage() for r in caplog.records if r.name == "rsigym.access"]
    assert len(lines) == 4, lines
    if fmt == "json":
        rows = [json.loads(line) for line in lines]
    else:
        rows = [dict(part.split("=", 1) for part in line.split(" ")) for line in lines]
    first = rows[0]
    assert first["request_id"] == ok.headers["x-request-id"] and first["key_id"] == run["id"]
    assert first["path"] == "/rollout/v1/chat/completions" and str(first["status"]) == "200"
    assert float(first["cost_usd"]) == pytest.approx(float(ok.headers["x-rsigym-cost-usd"]))
    assert float(first["latency_ms"]) > 0
    assert [str(r["status"]) for r in rows] == [str(ok.status_code), str(refused.status_code), "401",
                                                str(admin.status_code)]
    assert rows[1]["key_id"] == run["id"] and rows[2]["key_id"] in (None, "-")
    everything = "\n".join(lines)
    for secret in (run["key"], "rsk-not-a-real-key-but-secret-looking", ADMIN_TOKEN):
        assert secret not in everything
    assert bad.status_code == 401
