"""``/metrics`` shows every service's spend (issue 16, item 5): the sandbox seconds the sandbox
service bills itself, as well as the calls the gateway settles — summed from the ledger, so any
replica reports the whole gym and no charge is counted twice."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable

import pytest

from ops.builder import Gym
from tests.conftest import admin_headers, bearer, client_for, create_key


def _charged(text: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r'^rsigym_ledger_charged_usd_total\{service="([a-z_]+)"\} (\S+)$',
                                                   text, re.M)}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_metrics_show_the_spend_of_every_service_as_the_ledger_has_it(make_gym: Callable[..., Gym]) -> None:
    client = client_for(make_gym())
    run = create_key(client, 1.0)
    chat = {"model": "teacher", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4}
    assert client.post("/rollout/v1/chat/completions", json=chat, headers=bearer(run["key"])).status_code == 200
    created = client.post("/sandbox/v2/sandboxes", json={"templateID": "base", "timeout": 30},
                          headers={"X-API-Key": run["key"]})
    assert created.status_code == 201, created.text
    assert client.delete(f"/sandbox/sandboxes/{created.json()['sandboxID']}",
                         headers={"X-API-Key": run["key"]}).status_code == 204

    ledger = client.get(f"/admin/v1/keys/{run['id']}/ledger", headers=admin_headers()).json()["data"]
    by_service: dict[str, float] = {}
    for row in ledger:
        by_service[row["service"]] = by_service.get(row["service"], 0.0) + (row.get("actual_usd") or 0.0)
    assert by_service.get("sandbox", 0) > 0 and by_service.get("rollout", 0) > 0

    text = client.get("/metrics", headers=admin_headers()).text
    charged = _charged(text)
    for service, usd in by_service.items():
        assert charged.get(service) == pytest.approx(usd, rel=1e-9, abs=1e-12), (service, charged)
    # what the gateway settled itself never had the sandbox's seconds
    assert 'rsigym_spend_usd_total{service="sandbox"}' not in text
