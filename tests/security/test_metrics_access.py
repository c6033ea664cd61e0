"""``/metrics`` is for the operator, not for whoever reaches the gateway (security issue, item 8).

Metrics name every service, model and refusal type and add up spend: an agent reading them
learns about other runs. They answer the admin token, or a scrape token that opens nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ops.builder import Gym
from tests.conftest import admin_headers, bearer, client_for, create_key

SCRAPE_TOKEN = "rsm-scrape-token-for-prometheus"


def test_metrics_need_the_admin_or_the_scrape_token(make_gym: Callable[..., Gym]) -> None:
    gym = make_gym()
    gym.gateway.context.settings.metrics_token = SCRAPE_TOKEN
    client = client_for(gym)
    run_key = create_key(client, 1.0)["key"]
    chat = {"model": "teacher", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4}
    assert client.post("/rollout/v1/chat/completions", json=chat, headers=bearer(run_key)).status_code == 200

    attempts: dict[str, dict[str, str]] = {
        "nobody": {}, "run key": bearer(run_key), "x-api-key": {"X-API-Key": run_key},
        "wrong token": bearer("rsa-not-the-admin-token"), "empty bearer": {"Authorization": "Bearer "},
    }
    for who, headers in attempts.items():
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401, who
        assert r.json()["error"]["type"] == "authentication_error", who
        assert "rsigym_" not in r.text, f"{who} read metrics"

    for headers in (admin_headers(), bearer(SCRAPE_TOKEN)):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 200 and 'rsigym_requests_total{operation="chat.completions"' in r.text

    # The scrape token opens nothing else: not the admin API, not a service.
    denied: list[tuple[str, str, Any]] = [("GET", "/admin/v1/keys", None), ("POST", "/admin/v1/keys",
                                          {"track": "joint", "budget_usd": 1}), ("POST", "/rollout/v1/chat/completions",
                                          chat), ("GET", "/v1/balance", None)]
    for method, path, body in denied:
        r = client.request(method, path, json=body, headers=bearer(SCRAPE_TOKEN))
        assert r.status_code == 401, (method, path, r.text)


def test_without_a_scrape_token_only_the_admin_reads_metrics(make_gym: Callable[..., Gym]) -> None:
    client = client_for(make_gym())
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer("")).status_code == 401
    assert client.get("/metrics", headers=admin_headers()).status_code == 200
