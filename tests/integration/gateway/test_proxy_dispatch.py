"""Proxied calls take the short way through the gateway app (gateway/proxy_dispatch.py): past
FastAPI's router, with every refusal still in the one error shape, and never past a route of
the gateway's own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request
from starlette.responses import Response

import gateway.app
from gateway.proxy_dispatch import GATEWAY_SEGMENTS, ProxyDispatch
from kit.errors import PermissionDenied
from ops.builder import Gym
from tests.conftest import bearer, client_for, create_key

CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "What is 12 + 30?"}], "max_tokens": 8}


def _spy_forward(monkeypatch: pytest.MonkeyPatch, then: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
    """Wrap the gateway's ``forward`` (before the app is built) to see the scope each call reached it with."""
    seen: list[dict[str, Any]] = []
    real = gateway.app.forward

    async def spy(request: Request, service: str, path: str, *args: Any) -> Response:
        seen.append({"endpoint": request.scope.get("endpoint"), "route": request.scope.get("route"),
                     "service": service, "path": path})
        if then is not None:
            then()
        return await real(request, service, path, *args)

    monkeypatch.setattr(gateway.app, "forward", spy)
    return seen


def test_a_proxied_call_reaches_forward_without_the_router(make_gym: Callable[..., Gym],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy_forward(monkeypatch)
    client = client_for(make_gym())
    run = create_key(client, 1.0)
    r = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(run["key"]))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "42"
    assert float(r.headers["x-rsigym-cost-usd"]) > 0  # metered as before
    assert r.headers["x-request-id"].startswith("req_")
    # The router would have put its endpoint and route in the scope; the short way puts neither.
    assert seen == [{"endpoint": None, "route": None, "service": "rollout", "path": "v1/chat/completions"}]


def test_refusals_on_the_short_way_keep_the_one_error_shape(make_gym: Callable[..., Gym]) -> None:
    client = client_for(make_gym())
    run = create_key(client, 1.0)

    bad_key = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer("rsk-forged"))
    no_op = client.post("/rollout/v1/nothing-here", json=CHAT, headers=bearer(run["key"]))
    child = client.post("/v1/keys", headers=bearer(run["key"]),
                        json={"name": "sandbox-only", "policy": {"services": {"sandbox": {}}}})
    assert child.status_code == 201, child.text
    denied = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(child.json()["key"]))
    for answer, status, kind in ((bad_key, 401, "authentication_error"), (no_op, 404, "not_found"),
                                 (denied, 403, "permission_denied")):
        body = answer.json()
        assert answer.status_code == status, answer.text
        assert body["error"]["type"] == kind and body["code"] == status
        assert body["request_id"] == answer.headers["x-request-id"]  # the request-id middleware still wraps it
    balance = client.get("/v1/balance", headers=bearer(run["key"])).json()
    assert balance["spent_usd"] == 0 and balance["reserved_usd"] == 0  # nothing was charged or left held


def test_an_unexpected_error_is_a_500_in_the_one_shape(make_gym: Callable[..., Gym],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise RuntimeError("a bug in the forwarding code")

    _spy_forward(monkeypatch, then=boom)
    gym = make_gym()
    client: Any = TestClient(gym.app, base_url="http://gym", raise_server_exceptions=False)
    run = create_key(client, 1.0)
    r = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(run["key"]))
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "internal_error" and "a bug" not in r.text


def test_other_methods_and_paths_still_take_the_router(make_gym: Callable[..., Gym],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy_forward(monkeypatch)
    client = client_for(make_gym())
    run = create_key(client, 1.0)
    head = client.request("OPTIONS", "/rollout/v1/chat/completions", headers=bearer(run["key"]))
    assert head.status_code == 405 and head.json()["error"]["type"] == "invalid_request_error"
    own = client.get("/v1/balance", headers=bearer(run["key"]))  # the gateway's own route, not a service's
    assert own.status_code == 200 and "remaining_usd" in own.json()
    unknown = client.post("/nosuchservice/v1/x", json={}, headers=bearer(run["key"]))
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found"
    # The unknown service went the router's way to the catch-all, which the router marks in the scope.
    assert [s["service"] for s in seen] == ["nosuchservice"] and seen[0]["endpoint"] is not None


def test_no_gateway_route_lives_under_a_service_name(gym: Gym) -> None:
    """The short way passes over nothing: every route of the gateway's own starts with a segment
    of ``GATEWAY_SEGMENTS``, and no service is named like one."""
    assert not set(gym.gateway.specs) & GATEWAY_SEGMENTS
    paths = set(gym.app.openapi()["paths"])
    paths |= {p for r in gym.app.router.routes if isinstance(p := getattr(r, "path", None), str)}
    firsts = {p.lstrip("/").partition("/")[0] for p in paths} - {"{service}"}
    assert firsts <= GATEWAY_SEGMENTS, firsts - GATEWAY_SEGMENTS


def test_a_service_named_like_a_gateway_route_is_refused() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    async def forward(request: Request, service: str, path: str) -> Response:
        raise PermissionDenied("never called")

    with pytest.raises(ValueError, match="admin"):
        ProxyDispatch(app, services={"rollout", "admin"}, methods=["POST"], forward=forward)
