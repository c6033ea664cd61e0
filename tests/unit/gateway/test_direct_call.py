"""A hot route taken in process by the embedded gateway (gateway/direct_call.py) answers exactly
what the service's whole app answers through the in-process transport.

The same calls go through two links to one service app: one that hands the service's direct
routes to their handler in process, with the identity object, one that runs the app through the
transport, signed (as every call did before). Status, body (all but the request id) and headers
must match, for a good call, one the endpoint refuses, one that makes it fail, a query, a streamed
answer, one the service breaks off, a route that is not direct and an odd path. A call signed with
another key is refused before it reaches the endpoint, identity headers a caller slips in set
nothing, and a stream whose reader goes away stops its producer.
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
from gateway.direct_call import DirectResponse, DirectService, DirectStream, DirectTransport
from gateway.service_call import ServiceCall
from gateway.service_link import ServiceLink, SignedTransport
from kit.errors import InvalidRequest
from kit.http import json_object
from kit.identity import IN_PROCESS_IDENTITY, Identity, sign
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


def _identity(key_id: str = "key_kit") -> Identity:
    return Identity(request_id="req_kit", key_id=key_id, run_id=key_id, service="kit", operation="echo",
                    policies=[], issued_at=time.time())


HEADERS = {"content-type": "application/json", "accept-encoding": "identity", "x-request-id": "req_kit"}


def _call(path: str, body: bytes, *, query: str = "", headers: dict[str, str] | None = None,
          secret: str = SECRET, identity: Identity | None = None) -> ServiceCall:
    """A call as the gateway's forward builds it (``path`` decoded, ``headers`` unsigned)."""
    return ServiceCall("POST", path, query, headers or HEADERS, body, identity or _identity(), secret)


def _calls() -> list[ServiceCall]:
    good = json.dumps({"hello": "world"}).encode()
    calls = [_call("/v1/echo", json.dumps(body).encode()) for body in ({"refuse": True}, {"crash": True}, {"hello": "world"})]
    calls.append(_call("/v1/echo", good, query="a=1&b=%20c"))
    calls.append(_call("/v1/stream", b'{"n":4}'))
    calls.append(_call("/v1/stream", b'{"n":4,"fail_at":2}'))
    calls.append(_call("/v1/routed", good))
    calls.append(_call("/v1/echo/..", good))  # not a direct route as it travels
    return calls


async def _read(r: Any) -> tuple[int, Any, dict[str, str], list[dict[str, Any]]]:
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
    return r.status_code, payload, kept, list(reached)


async def _answers(direct: bool) -> tuple[list[tuple[int, Any, dict[str, str], list[dict[str, Any]]]], int]:
    link, counting = _link(direct)
    answers = []
    for call in _calls():
        reached.clear()
        answers.append(await _read(await link.send(call)))
    return answers, counting.calls


def test_a_hot_route_in_process_answers_what_the_whole_app_answers() -> None:
    (through_app, entered_app), (in_process, entered_direct) = asyncio.run(_answers(False)), asyncio.run(_answers(True))
    assert [a[0] for a in in_process] == [400, 500, 200, 200, 200, 200, 200, 404]
    assert in_process == through_app
    assert in_process[2][1] == {"key": "key_kit", "echo": {"hello": "world"}}
    assert in_process[3][3][0]["query"] == "a=1&b=%20c"
    assert in_process[4][1] == "".join(f"data: {i}\n\n" for i in range(4))
    assert in_process[5][1] == "data: 0\n\ndata: 1\n\n<RemoteProtocolError>"  # broken off, as over the transport
    # every call entered the whole app before; now only the route that is not direct and the odd path
    assert (entered_app, entered_direct) == (len(_calls()), 2)


def test_a_whole_answer_comes_back_without_the_transport() -> None:
    async def go() -> Any:
        link, _ = _link(True)
        return await link.send(_call("/v1/echo", b'{"hello":"world"}'))

    assert isinstance(asyncio.run(go()), DirectResponse)


async def _two_chunks_then_close(stall_s: float = 0.0) -> tuple[Any, list[bytes], int]:
    """Open a long stream, read two chunks, wait ``stall_s``, close it: (the response, the chunks
    read, the chunks its producer had made before the close)."""
    link, _ = _link(True)
    r = await link.send(_call("/v1/stream", b'{"n":100000}'))
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


def test_the_identity_is_handed_in_process_and_signed_across_the_app() -> None:
    """The link decides how the identity travels: a hot route is handed the object, a call that
    enters the whole app is signed with the call's key. Signed with another key, the app refuses it
    before its endpoint runs; the in-process handler is given the object and checks no signature."""
    good = b'{"hello":"world"}'

    async def go() -> list[tuple[int, Any, dict[str, str], list[dict[str, Any]]]]:
        link, counting = _link(True)
        assert isinstance(link.transport, DirectTransport) and isinstance(link.transport.app_transport, SignedTransport)
        answers = []
        for path in ("/v1/echo", "/v1/routed"):
            for secret in (SECRET, "another-key"):
                reached.clear()
                answers.append(await _read(await link.send(_call(path, good, secret=secret))))
        assert counting.calls == 2  # only the route that is not direct entered the whole app
        return answers

    hot, hot_other_key, routed, routed_other_key = asyncio.run(go())
    assert hot[:2] == hot_other_key[:2] == (200, {"key": "key_kit", "echo": {"hello": "world"}})
    assert (routed[0], routed[1], len(routed[3])) == (200, {"routed": True}, 1)
    assert (routed_other_key[0], routed_other_key[1]["error"]["type"]) == (401, "authentication_error")
    assert routed_other_key[3] == []  # refused before the endpoint ran


def test_identity_headers_a_caller_slips_in_set_nothing() -> None:
    """Headers that carry another key's identity, signed with the gym's own secret, change nothing:
    in process the handler reads the object, across the app the call's own signature replaces them."""
    good = b'{"hello":"world"}'
    slipped = {**HEADERS, **sign(_identity("key_other"), SECRET, "POST", "/v1/echo", good)}

    async def go(direct: bool) -> tuple[int, Any, dict[str, str], list[dict[str, Any]]]:
        link, _ = _link(direct)
        reached.clear()
        return await _read(await link.send(_call("/v1/echo", good, headers=slipped, identity=_identity("key_own"))))

    for direct in (True, False):
        status, payload, _, _ = asyncio.run(go(direct))
        assert (status, payload) == (200, {"key": "key_own", "echo": {"hello": "world"}}), direct


def test_an_unsigned_call_to_a_hot_route_through_the_app_is_refused() -> None:
    """What reaches the service's app carries only headers: unsigned, its hot route refuses it
    before the endpoint runs, whatever identity object its caller held."""
    async def go() -> tuple[int, Any, list[dict[str, Any]]]:
        _, counting = _link(False)
        transport = StreamingASGITransport(counting)
        reached.clear()
        request = httpx.Request("POST", "http://kit.internal/v1/echo", headers=HEADERS, content=b'{"hello":"world"}',
                                extensions={IN_PROCESS_IDENTITY: _identity()})
        r = await transport.handle_async_request(request)
        return r.status_code, json.loads(await r.aread()), list(reached)

    status, body, hits = asyncio.run(go())
    assert (status, body["error"]["type"], hits) == (401, "authentication_error", [])
