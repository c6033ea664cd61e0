"""Server-sent events: decoding, the Stream objects, and errors before / during a stream."""

from __future__ import annotations

import json

import httpx
import pytest

import rsigym
from rsigym._streaming import ServerSentEvent, SSEDecoder

HI = [{"role": "user", "content": "hi"}]


def _decode_all(raw: bytes, piece: int) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for i in range(0, len(raw), piece):
        events += decoder.feed(raw[i : i + piece])
    return events + decoder.flush()


RAW = (
    b": keep-alive comment\n\n"
    b'data: {"a": 1}\n\n'
    b"event: progress\r\nid: 7\r\ndata: line one\r\ndata: line two \xc3\xa9\r\n\r\n"
    b":another comment\n"
    b"data:no-space\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    ServerSentEvent(data='{"a": 1}'),
    ServerSentEvent(data="line one\nline two \u00e9", event="progress", id="7"),
    ServerSentEvent(data="no-space", id="7"),
    ServerSentEvent(data="[DONE]", id="7"),
]


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 1000])
def test_decoder_gives_the_same_events_however_the_bytes_are_cut(piece):
    # piece=1 splits every \r\n and the two bytes of "é" across reads
    assert _decode_all(RAW, piece) == EXPECTED


def test_decoder_flushes_a_last_event_without_blank_line():
    assert _decode_all(b"data: tail", 4) == [ServerSentEvent(data="tail")]


def test_decoder_ignores_comment_only_streams():
    assert _decode_all(b": ping\n\n: ping\n\n", 5) == []


def _chunk_bytes(canned, *contents: str) -> list[bytes]:
    chunk, event = canned["chunk"], canned["sse_event"]
    out = [event(chunk(role="assistant"))]
    out += [event(chunk(c)) for c in contents]
    out.append(event(chunk(finish="stop")))
    return out


def _split_badly(data: bytes) -> list[bytes]:
    """Cut a body at awkward places: inside JSON, between \\n and \\n."""
    cuts = [5, 6, 17, 40, 41, 90, len(data) - 3]
    pieces, start = [], 0
    for cut in sorted(c for c in cuts if 0 < c < len(data)):
        pieces.append(data[start:cut])
        start = cut
    return pieces + [data[start:]]


def test_stream_yields_chunks_and_exposes_headers(gateway, canned):
    body = b": ping\n\n" + b"".join(_chunk_bytes(canned, "Hel", "lo", " wörld")) + b"data: [DONE]\n\n"
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.sse(_split_badly(body), request_id="req_s1", cost="0.0004", remaining="4.5"),
    )
    with gateway.gym() as gym:
        stream = gym.rollout.chat(model="teacher", messages=HI, stream=True, max_tokens=16)
        assert isinstance(stream, rsigym.Stream)
        assert (stream.request_id, stream.cost_usd, stream.remaining_usd) == ("req_s1", 0.0004, 4.5)
        chunks = list(stream)
    assert all(isinstance(c, rsigym.ChatCompletionChunk) for c in chunks)
    assert "".join(c.text for c in chunks) == "Hello wörld"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    sent = gateway.json_sent()
    assert sent["stream"] is True and sent["max_tokens"] == 16
    assert gateway.requests[0].headers["Accept"] == "text/event-stream"


def test_nothing_after_done_is_parsed(gateway, canned):
    body = canned["sse_event"](canned["chunk"]("x")) + b"data: [DONE]\n\ndata: not json at all\n\n"
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse([body]))
    with gateway.gym() as gym:
        assert [c.text for c in gym.rollout.chat(model="teacher", messages=HI, stream=True)] == ["x"]


def test_exact_cost_from_usage_replaces_the_reserved_upper_bound(gateway, canned):
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "cost_usd": 0.00042}
    body = [
        *_chunk_bytes(canned, "ok"),
        canned["sse_event"](canned["chunk"](usage=usage)),  # no id, no created: as the server sends it
        b"data: [DONE]\n\n",
    ]
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse(body, cost="0.002000000", remaining="3.5"))
    with gateway.gym() as gym:
        stream = gym.rollout.chat(model="teacher", messages=HI, stream=True, stream_options={"include_usage": True})
        assert (stream.cost_usd, stream.cost_is_upper_bound) == (0.002, True)  # only the hold is known yet
        chunks = list(stream)
    assert (stream.cost_usd, stream.cost_is_upper_bound) == (0.00042, False)
    assert stream.usage.total_tokens == 5
    assert chunks[-1].choices == [] and chunks[-1].id is None and chunks[-1].text == ""
    assert gateway.json_sent()["stream_options"] == {"include_usage": True}


def test_without_usage_the_cost_stays_the_upper_bound(gateway, canned):
    body = [*_chunk_bytes(canned, "ok"), b"data: [DONE]\n\n"]
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse(body, cost="0.002"))
    with gateway.gym() as gym:
        stream = gym.rollout.chat(model="teacher", messages=HI, stream=True)
        list(stream)
    assert (stream.cost_usd, stream.cost_is_upper_bound, stream.usage) == (0.002, True, None)


def test_error_before_the_stream_starts_raises_from_chat(gateway):
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.error(402, "budget_exhausted", "Budget exhausted", request_id="req_402"),
    )
    with gateway.gym() as gym, pytest.raises(rsigym.BudgetExhaustedError) as info:
        gym.rollout.chat(model="teacher", messages=HI, stream=True)
    assert info.value.request_id == "req_402"
    assert info.value.message == "Budget exhausted"


def test_error_event_mid_stream_raises_after_the_earlier_chunks(gateway, canned):
    err = {
        "type": "error",
        "error": {"type": "budget_exhausted", "message": "ran out mid-answer", "param": None},
        "request_id": "req_mid",
    }
    body = canned["sse_event"](canned["chunk"]("partial")) + canned["sse_event"](err)
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse([body]))
    received = []
    with gateway.gym() as gym, pytest.raises(rsigym.BudgetExhaustedError) as info:
        for chunk in gym.rollout.chat(model="teacher", messages=HI, stream=True):
            received.append(chunk.text)
    assert received == ["partial"]
    assert (info.value.message, info.value.request_id) == ("ran out mid-answer", "req_mid")


def test_upstream_failure_mid_stream_in_the_services_shape(gateway, canned):
    err = {"error": {"type": "upstream_error", "message": "provider closed the stream", "param": None}}
    body = canned["sse_event"](canned["chunk"]("par")) + canned["sse_event"](err) + b"data: [DONE]\n\n"
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse([body], request_id="req_up"))
    with gateway.gym() as gym, pytest.raises(rsigym.InternalServerError) as info:
        list(gym.rollout.chat(model="teacher", messages=HI, stream=True))
    assert (info.value.status_code, info.value.type, info.value.request_id) == (502, "upstream_error", "req_up")


def test_event_named_error_is_raised(gateway):
    body = b'event: error\ndata: {"message": "backend crashed"}\n\n'
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse([body]))
    with gateway.gym() as gym, pytest.raises(rsigym.APIStatusError, match="backend crashed"):
        list(gym.rollout.chat(model="teacher", messages=HI, stream=True))


def test_garbage_event_is_a_response_validation_error(gateway):
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse([b"data: {not json\n\n"]))
    with gateway.gym() as gym, pytest.raises(rsigym.APIResponseValidationError):
        list(gym.rollout.chat(model="teacher", messages=HI, stream=True))


def test_stream_closes_the_response_when_exhausted(gateway, canned, chunked_stream):
    body = chunked_stream(_chunk_bytes(canned, "a") + [b"data: [DONE]\n\n"])
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse([], stream=body))
    with gateway.gym() as gym:
        stream = gym.rollout.chat(model="teacher", messages=HI, stream=True)
        list(stream)
    assert body.closed
    assert stream.response.is_closed


def test_leaving_the_with_block_early_closes_the_stream(gateway, canned, chunked_stream):
    body = chunked_stream(_chunk_bytes(canned, *"abcdefgh"))
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse([], stream=body))
    with gateway.gym() as gym:
        with gym.rollout.chat(model="teacher", messages=HI, stream=True) as stream:
            first = next(iter(stream))
        assert first.choices[0].delta.role == "assistant"
    assert body.closed
    assert body.delivered < len(body.chunks)


def test_connection_lost_mid_stream_is_a_connection_error(gateway, canned, chunked_stream):
    body = chunked_stream(_chunk_bytes(canned, "a"), fail_with=httpx.ReadError("peer reset"))
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.sse([], stream=body))
    with gateway.gym() as gym, pytest.raises(rsigym.APIConnectionError):
        list(gym.rollout.chat(model="teacher", messages=HI, stream=True))


@pytest.mark.asyncio
async def test_async_stream(gateway, canned, chunked_stream):
    body = chunked_stream(_split_badly(b"".join(_chunk_bytes(canned, "as", "ync")) + b": ping\n\ndata: [DONE]\n\n"))
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.sse([], stream=body, request_id="req_as", cost="0.001", remaining="2"),
    )
    async with gateway.async_gym() as gym:
        stream = await gym.rollout.chat(model="teacher", messages=HI, stream=True)
        assert isinstance(stream, rsigym.AsyncStream)
        async with stream:
            texts = [chunk.text async for chunk in stream]
    assert "".join(texts) == "async"
    assert (stream.request_id, stream.cost_usd, stream.remaining_usd) == ("req_as", 0.001, 2.0)
    assert body.closed


@pytest.mark.asyncio
async def test_async_error_before_stream(gateway):
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.error(403, "permission_denied", "not allowed"))
    async with gateway.async_gym() as gym:
        with pytest.raises(rsigym.PermissionDeniedError):
            await gym.rollout.chat(model="teacher", messages=HI, stream=True)


@pytest.mark.asyncio
async def test_async_gym_over_asgi_transport():
    """An AsyncGym runs against a real ASGI app (no server package needed)."""

    async def app(scope, receive, send):
        assert scope["type"] == "http"
        request = json.loads((await receive())["body"])
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"x-request-id", b"req_asgi"),
            (b"x-rsigym-cost-usd", b"0.5"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for word in request["messages"][0]["content"].split():
            event = {"id": "c", "model": request["model"], "choices": [{"index": 0, "delta": {"content": word}}]}
            await send(
                {"type": "http.response.body", "body": f"data: {json.dumps(event)}\n\n".encode(), "more_body": True}
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    async with rsigym.AsyncGym(base_url="http://asgi", api_key="k", http_client=http) as gym:
        stream = await gym.rollout.chat(model="m", messages=[{"role": "user", "content": "one two three"}], stream=True)
        words = [chunk.text async for chunk in stream]
    await http.aclose()
    assert words == ["one", "two", "three"]
    assert (stream.request_id, stream.cost_usd) == ("req_asgi", 0.5)
