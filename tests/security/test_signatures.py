"""Acceptance: a request straight to a service, without the gateway's signature, is refused."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from kit.identity import Identity, sign

BODY = json.dumps({"model": "teacher", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()


def _identity(**overrides: Any) -> Identity:
    fields: dict[str, Any] = dict(request_id="req_test", key_id="key_x", run_id="key_x", service="rollout",
                                  operation="chat.completions", policies=[{"models": "*"}], issued_at=time.time())
    fields.update(overrides)
    return Identity(**fields)


@pytest.fixture
def direct(gym: Any) -> httpx.AsyncClient:
    """Straight to the rollout service app, bypassing the gateway."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(gym.service_apps["rollout"]), base_url="http://rollout")


def _post(direct: httpx.AsyncClient, headers: dict[str, str], body: bytes = BODY) -> Any:
    import asyncio

    return asyncio.run(direct.post("/v1/chat/completions", content=body, headers={"content-type": "application/json", **headers}))


def test_unsigned_call_is_refused(direct: httpx.AsyncClient, standin: Any) -> None:
    before = len(standin[1].state.requests)
    r = _post(direct, {})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert len(standin[1].state.requests) == before


def test_forged_tampered_or_stale_signatures_are_refused(direct: httpx.AsyncClient, gym: Any, standin: Any) -> None:
    secret = gym.gateway.internal_secret
    before = len(standin[1].state.requests)
    forged = sign(_identity(), "not-the-secret", "POST", "/v1/chat/completions", BODY)
    tampered = sign(_identity(), secret, "POST", "/v1/chat/completions", BODY)
    stale = sign(_identity(issued_at=time.time() - 3600), secret, "POST", "/v1/chat/completions", BODY)
    wrong_path = sign(_identity(), secret, "POST", "/v1/models", BODY)
    altered = BODY.replace(b'"max_tokens": 3', b'"max_tokens": 3000')
    assert altered != BODY
    for headers, body in ((forged, BODY), (tampered, altered),
                          (stale, BODY), (wrong_path, BODY)):
        r = _post(direct, headers, body)
        assert r.status_code == 401, r.text
    assert len(standin[1].state.requests) == before


def test_a_properly_signed_call_is_served(direct: httpx.AsyncClient, gym: Any) -> None:
    """Control: the refusals above are about the signature, not a broken service."""
    headers = sign(_identity(), gym.gateway.internal_secret, "POST", "/v1/chat/completions", BODY)
    r = _post(direct, headers)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
