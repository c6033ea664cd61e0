"""A hot route taken in process by the embedded gateway (gateway/direct_call.py) answers exactly
what the service's whole app answers through the in-process transport.

The same signed calls go through two links to one service app: one that hands the service's direct
routes to their handler in process, one that runs the app through the transport (as every call
did before). Status, body (all but the request id) and headers must match, for a good call, a
forged signature, a body altered after signing, one the endpoint refuses, one that makes it fail,
a streamed answer, one the service breaks off, a route that is not direct and an odd path. No call the signature refuses may
reach the endpoint, and a stream whose reader goes away stops its producer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.asgi_transport import StreamingASGITransport
from gateway.direct_call import DirectResponse, DirectService, DirectStream
from gateway.proxy import wire_path
from gateway.service_link import ServiceLink
from kit.errors import InvalidRequest
from kit.http import json_object
from kit.identity import Identity, sign
from kit.service_app import CurrentIdentity, create_service_app

SECRET = "kit-secret"
TIMEOUT = httpx.Timeout(5.0)
reached: list[dict[str, Any]] = []
stream_ends: list[str] = []
made = [0]
"""Chunks the streaming route has produced (its producer's progress)."""
router = APIRouter(prefix="/v1")


@router.post("/echo")
async def echo(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request)
    reached.append({"path": request.scope["path"], "body": body, "query": request.url.query})
    if body.get("refuse"):
        raise InvalidRequest("refused by the endpoint", param="refuse")
    if body.get("crash"):
        raise RuntimeError("a bug")
    return JSONResponse({"key": identity.key_id, "echo": body}, headers={"x-cost-nusd": "7"})


@router.post("/stream")
async def stream(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request)
    reached.append({"path": request.scope["path"], "body": body})

    async def events() -> AsyncIterator[bytes]:
        try:
            for i in range(int(body.get("n", 3))):
                if i == body.get("fail_at"):
                    raise RuntimeError("a bug mid-stream")
                made[0] += 1
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(0)
            stream_ends.append("done")
        finally:
            stream_ends.append("closed")

    return StreamingResponse(events(), media_type="text/event-stream")


@router.post("/routed")
async def routed(request: Request, identity: CurrentIdentity) -> Response:
    reached.append({"path": request.scope["path"], "body": await json_object(request)})
    return JSONResponse({"routed": True})


class Counting:
    """The service app, counting the calls that entered it whole."""

    def __init__(self, app: Any):
        self.app, self.calls = app, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        await self.app(scope, receive, send)


def _link(direct: bool) -> tuple[ServiceLink, Counting]:
    app = create_service_app("kit", internal_secret=SECRET, routers=[router],
                             direct={("POST", "/v1/echo"): echo, ("POST", "/v1/stream"): stream})
    counting = Counting(app)
    helper = DirectService(app, server=("kit.internal", 80)) if direct else None
    return ServiceLink("http://kit.internal", StreamingASGITransport(counting), TIMEOUT, direct=helper), counting


def _signed(path: str, body: bytes, *, secret: str = SECRET, query: str = "") -> dict[str, str]:
    identity = Identity(request_id="req_kit", key_id="key_kit", run_id="key_kit", service="kit", operation="echo",
                        policies=[], issued_at=time.time())
    target = path + (f"?{query}" if query else "")
    return {"content-type": "application/json", "accept-encoding": "identity", "x-request-id": "req_kit",
            **sign(identity, secret, "POST", target, body)}


def _calls() -> list[tuple[str, str, dict[str, str], bytes]]:
    """(decoded path, query, headers, body) as the gateway's forward sends them."""
    good = json.dumps({"hello": "world"}).encode()
    calls = [("/v1/echo", "", _signed("/v1/echo", good, secret="forged"), good),
             ("/v1/echo", "", _signed("/v1/echo", good), good.replace(b"world", b"earth")),  # altered after signing
             ("/v1/echo", "", _signed("/v1/other", good), good)]  # signed for another path
    for body in ({"refuse": True}, {"crash": True}, {"hello": "world"}):
        raw = json.dumps(body).encode()
        calls.append(("/v1/echo", "", _signed("/v1/echo", raw), raw))
    calls.append(("/v1/echo", "a=1&b=%20c", _signed("/v1/echo", good, query="a=1&b=%20c"), good))
    calls.append(("/v1/stream", "", _signed("/v1/stream", b'{"n":4}'), b'{"n":4}'))
    calls.append(("/v1/stream", "", _signed("/v1/stream", b'{"n":4,"fail_at":2}'), b'{"n":4,"fail_at":2}'))
    calls.append(("/v1/routed", "", _signed("/v1/routed", good), good))
    calls.append(("/v1/echo/..", "", _signed("/v1/echo/..", good), good))  # not a direct route as it travels
    return calls


async def _answers(direct: bool) -> tuple[list[tuple[int, Any, dict[str, str], list[dict[str, Any]]]], int]:
    link, counting = _link(direct)
    answers = []
    for path, query, headers, body in _calls():
        reached.clear()
        target = wire_path(path) + (f"?{query}" if query else "")
        r = await link.send("POST", target, headers, body, path=path)
        chunks = []
        try:
            async for chunk in r.aiter_raw():
                chunks.append(chunk)
        except httpx.HTTPError as err:  # a stream the service broke off
            chunks.append(f"<{type(err).__name__}>".encode())
        raw = b"".join(chunks)
        await r.aclose()
        payload: Any = raw.decode()
        if r.headers.get("content-type", "").startswith("application/json"):
            payload = json.loads(raw)
            payload.pop("request_id", None)
            if isinstance(payload.get("error"), dict):
                payload["error"]["message"] = payload["error"]["message"].split(" (request ")[0]
        kept = {h: r.headers[h] for h in ("content-type", "x-cost-nusd", "cache-control") if h in r.headers}
        answers.append((r.status_code, payload, kept, list(reached)))
    return answers, counting.calls


def test_a_hot_route_in_process_answers_what_the_whole_app_answers() -> None:
    (through_app, entered_app), (in_process, entered_direct) = asyncio.run(_answers(False)), asyncio.run(_answers(True))
    assert [a[0] for a in in_process] == [401, 401, 401, 400, 500, 200, 200, 200, 200, 200, 404]
    assert in_process == through_app
    for _status, _payload, _headers, hits in in_process[:3]:
        assert hits == []  # the signature refused them before the endpoint ran
    assert in_process[5][1] == {"key": "key_kit", "echo": {"hello": "world"}}
    assert in_process[6][3][0]["query"] == "a=1&b=%20c"
    assert in_process[7][1] == "".join(f"data: {i}\n\n" for i in range(4))
    assert in_process[8][1] == "data: 0\n\ndata: 1\n\n<RemoteProtocolError>"  # broken off, as over the transport
    # every call entered the whole app before; now only the route that is not direct and the odd path
    assert (entered_app, entered_direct) == (len(_calls()), 2)


def test_a_whole_answer_comes_back_without_the_transport() -> None:
    async def go() -> Any:
        link, _ = _link(True)
        raw = b'{"hello":"world"}'
        return await link.send("POST", "/v1/echo", _signed("/v1/echo", raw), raw, path="/v1/echo")

    assert isinstance(asyncio.run(go()), DirectResponse)


async def _two_chunks_then_close(stall_s: float = 0.0) -> tuple[Any, list[bytes], int]:
    """Open a long stream, read two chunks, wait ``stall_s``, close it: (the response, the chunks
    read, the chunks its producer had made before the close)."""
    link, _ = _link(True)
    raw = b'{"n":100000}'
    r = await link.send("POST", "/v1/stream", _signed("/v1/stream", raw), raw, path="/v1/stream")
    got = []
    async for chunk in r.aiter_raw():
        got.append(chunk)
        if len(got) == 2:
            break
    await asyncio.sleep(stall_s)
    produced = made[0]
    await r.aclose()
    return r, got, produced


def test_a_streamed_answer_is_read_from_its_producer_as_the_reader_asks() -> None:
    """No task, queue or httpx response between a hot route's stream and the gateway: the reader
    pulls each chunk from the producer, so a reader that stalls holds the producer at the chunk
    it asked for (the transport let it run up to 16 chunks ahead)."""
    made[0] = 0
    stream_ends.clear()
    r, got, produced = asyncio.run(_two_chunks_then_close(stall_s=0.05))
    assert isinstance(r, DirectStream)
    assert got == [b"data: 0\n\n", b"data: 1\n\n"]
    assert produced == 2, f"{produced} chunks made for a reader that asked for 2"
    assert stream_ends == ["closed"]


def test_a_stream_whose_reader_goes_away_stops_its_producer() -> None:
    stream_ends.clear()
    _, got, _ = asyncio.run(_two_chunks_then_close())
    assert got[0] == b"data: 0\n\n"
    assert stream_ends == ["closed"], "the producer ran on after its reader went away"


def _identity(key_id: str) -> Identity:
    return Identity(request_id="req_own", key_id=key_id, run_id=key_id, service="kit", operation="echo",
                    policies=[], issued_at=time.time())


def _unsigned() -> dict[str, str]:
    return {"content-type": "application/json", "accept-encoding": "identity", "x-request-id": "req_own"}


def test_the_gateway_hands_its_identity_in_process_and_nothing_unsigned_crosses_the_transport() -> None:
    """``forward`` hands a hot route its identity object and signs nothing (nothing crosses a
    socket or the transport). The same unsigned call to a route that takes the transport, with
    the identity object beside it, is refused: an identity object never travels, only a signature
    does, so a call that leaves the process unsigned fails closed."""
    good = b'{"hello":"world"}'

    async def go() -> list[tuple[int, Any, list[dict[str, Any]]]]:
        link, counting = _link(True)
        answers = []
        for path in ("/v1/echo", "/v1/routed"):
            reached.clear()
            assert link.in_process("POST", path, path) is (path == "/v1/echo")
            r = await link.send("POST", path, _unsigned(), good, path=path, identity=_identity("key_given"))
            answers.append((r.status_code, json.loads(await r.aread()), list(reached)))
            await r.aclose()
        # and with no identity object, an unsigned call to the hot route is refused as before
        reached.clear()
        r = await link.send("POST", "/v1/echo", _unsigned(), good, path="/v1/echo")
        answers.append((r.status_code, json.loads(await r.aread()), list(reached)))
        assert counting.calls == 1  # only the route that is not direct entered the whole app
        return answers

    (hot, hot_body, hot_hits), (routed, routed_body, routed_hits), (bare, bare_body, bare_hits) = asyncio.run(go())
    assert (hot, hot_body) == (200, {"key": "key_given", "echo": {"hello": "world"}})
    assert len(hot_hits) == 1
    assert (routed, routed_body["error"]["type"], routed_hits) == (401, "authentication_error", [])
    assert (bare, bare_body["error"]["type"], bare_hits) == (401, "authentication_error", [])
