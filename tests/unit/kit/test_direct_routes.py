"""A service's direct routes (kit/direct_routes.py) answer exactly what its router would.

The same service app is built twice, once with its hot route taken past FastAPI's router and
once without, and both are sent the same calls — unsigned, forged, signed for another path, a
body over the limit, a body that is not JSON, one the endpoint refuses, one that makes it fail,
a good one, another method on the same path. Status, error body (all but the request id) and
headers must match, and no call the signature refuses may reach the endpoint.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kit.config import GymConfig
from kit.errors import InvalidRequest
from kit.http import json_object
from kit.identity import Identity, sign
from kit.service_app import CurrentIdentity, create_service_app

SECRET = "kit-secret"
PATH = "/v1/echo"
reached: list[dict[str, Any]] = []
router = APIRouter(prefix="/v1")


@router.post("/echo")
async def echo(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request)
    reached.append({"body": body, "route": request.scope.get("route") is not None})
    if body.get("refuse"):
        raise InvalidRequest("refused by the endpoint", param="refuse")
    if body.get("crash"):
        raise RuntimeError("a bug")
    return JSONResponse({"key": identity.key_id, "echo": body}, headers={"x-echo": "1"})


def _app(direct: bool) -> Any:
    config = GymConfig.model_validate({"http": {"max_json_body_bytes": 4096, "max_upload_body_bytes": 4096},
                                       "sandbox": {"max_file_transfer_mb": 1}})  # a service's bound: ~1 MiB
    return create_service_app("kit", internal_secret=SECRET, routers=[router], config=config,
                              direct={("POST", PATH): echo} if direct else None)


def _signed(body: bytes, *, secret: str = SECRET, path: str = PATH, method: str = "POST") -> dict[str, str]:
    identity = Identity(request_id="req_kit", key_id="key_kit", run_id="key_kit", service="kit", operation="echo",
                        policies=[], issued_at=time.time())
    return {"content-type": "application/json", **sign(identity, secret, method, path, body)}


def _calls() -> list[tuple[str, str, dict[str, str], bytes]]:
    good = json.dumps({"hello": "world"}).encode()
    big = json.dumps({"pad": "x" * (3 << 20)}).encode()
    calls = [("POST", PATH, {"content-type": "application/json"}, good),
             ("POST", PATH, _signed(good, secret="forged"), good),
             ("POST", PATH, _signed(good, path="/v1/other"), good),
             ("POST", PATH, _signed(good), good.replace(b"world", b"earth")),  # body altered after signing
             ("POST", PATH, _signed(big), big),
             ("POST", PATH, _signed(b"[1, 2"), b"[1, 2"),
             ("POST", PATH, _signed(b"[1, 2]"), b"[1, 2]")]
    for body in ({"refuse": True}, {"crash": True}, {"hello": "world"}):
        raw = json.dumps(body).encode()
        calls.append(("POST", PATH, _signed(raw), raw))
    calls.append(("GET", PATH, _signed(b"", method="GET"), b""))
    return calls


async def _answers(direct: bool) -> list[tuple[int, Any, dict[str, str], list[dict[str, Any]]]]:
    answers = []
    transport = httpx.ASGITransport(_app(direct), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://kit") as client:
        for method, path, headers, body in _calls():
            reached.clear()
            r = await client.request(method, path, headers=headers, content=body)
            payload = r.json()
            if isinstance(payload, dict):
                payload.pop("request_id", None)
                if isinstance(payload.get("error"), dict):
                    payload["error"]["message"] = payload["error"]["message"].split(" (request ")[0]
            kept = {h: r.headers[h] for h in ("content-type", "x-echo") if h in r.headers}
            answers.append((r.status_code, payload, kept, [{"body": s["body"]} for s in reached]))
    return answers


def test_direct_routes_answer_what_the_router_answers() -> None:
    routed, direct = asyncio.run(_answers(False)), asyncio.run(_answers(True))
    assert [a[0] for a in direct] == [401, 401, 401, 401, 413, 422, 422, 400, 500, 200, 405]
    assert direct == routed
    for _status, _payload, _headers, hits in direct[:5]:
        assert hits == []  # refused before the endpoint ran


def test_the_direct_route_skips_the_router() -> None:
    async def one(direct: bool) -> bool:
        raw = json.dumps({"hello": "world"}).encode()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(_app(direct)), base_url="http://kit") as client:
            reached.clear()
            assert (await client.post(PATH, headers=_signed(raw), content=raw)).status_code == 200
        return reached[0]["route"]

    assert asyncio.run(one(False)) is True
    assert asyncio.run(one(True)) is False


@pytest.mark.parametrize("root", ["", "/mounted"])
def test_a_direct_route_is_matched_below_the_root_path(root: str) -> None:
    raw = json.dumps({"hello": "world"}).encode()

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(_app(True), root_path=root)
        async with httpx.AsyncClient(transport=transport, base_url="http://kit") as client:
            reached.clear()
            # the signature covers the path as the app's scope holds it, root path included
            return await client.post(root + PATH, headers=_signed(raw, path=root + PATH), content=raw)

    r = asyncio.run(call())
    assert r.status_code == 200, r.text
    assert reached and reached[0]["route"] is False
