"""A trial's e2b handle is built from its create's answer (``sdk_sandbox``), not by asking the
gateway again: it must carry what the SDK's own ``connect`` would have set up. The trials
themselves (tests/integration/services/evaluation/test_trials.py) drive sandboxes through it; this pins the parts of
the SDK it relies on, so an SDK upgrade that moves them fails here with a clear message."""

from __future__ import annotations

from services.evaluation.harbor.sandbox_sdk import sdk_sandbox

VIEW = {"templateID": "base", "sandboxID": "sbx_abc", "clientID": "rsigym", "envdVersion": "0.2.0",
        "envdAccessToken": "tok_secret", "domain": None}


def test_the_handle_talks_to_the_gateways_daemon_route_with_the_sandboxs_token() -> None:
    sbx = sdk_sandbox(VIEW, api_key="rsk-key", api_url="http://gw/sandbox", sandbox_url="http://gw/sandbox/envd")
    assert sbx.sandbox_id == "sbx_abc"
    assert sbx.envd_api_url == "http://gw/sandbox/envd"  # the gateway, never a sandbox domain
    headers = sbx.connection_config.sandbox_headers
    assert headers["X-Access-Token"] == "tok_secret" and headers["E2b-Sandbox-Id"] == "sbx_abc"
    assert sbx.connection_config.api_key == "rsk-key" and sbx.connection_config.api_url == "http://gw/sandbox"
    assert str(sbx._envd_version) == "0.2.0"
