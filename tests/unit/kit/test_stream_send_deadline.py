"""A streamed answer whose client stops accepting data is cut after ``send_timeout_s`` of one
send, and its body iterator is closed (the gateway settles and closes the upstream there); a
client that is slow on every chunk but never that slow on one gets the whole stream
(kit/http.py: ``ClosingStreamingResponse``, ``SendDeadline``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio

from kit.http import ClosingStreamingResponse

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
         "method": "POST", "path": "/x", "raw_path": b"/x", "query_string": b"", "headers": []}


class Producer:
    """A body iterator of ``n`` chunks that records how far it got and whether it was closed."""

    def __init__(self, n: int):
        self.n, self.produced, self.closed = n, 0, False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.n):
                self.produced += 1
                yield f"data: {i}\n\n".encode()
        finally:
            self.closed = True


async def _never_disconnects() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def test_a_client_that_stops_accepting_is_cut_and_the_producer_closed() -> None:
    producer = Producer(1_000)
    accepted: list[bytes] = []
    stuck = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            if len(accepted) == 3:  # the client stops reading: this send never returns
                stuck.set()
                await asyncio.Event().wait()
            accepted.append(message["body"])

    async def run() -> None:
        response = ClosingStreamingResponse(producer.chunks(), media_type="text/event-stream", send_timeout_s=0.2)
        await asyncio.wait_for(response(dict(SCOPE), _never_disconnects, send), timeout=30)

    asyncio.run(run())
    assert stuck.is_set()
    assert accepted == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert producer.closed and producer.produced == 4  # the fourth chunk was the one never taken


def test_a_client_slow_on_every_chunk_but_never_past_the_deadline_gets_the_whole_stream() -> None:
    """60 sends of 20 ms each: 1.2 s in all, longer than the 1 s deadline, which is per send."""
    producer = Producer(60)
    accepted: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            await asyncio.sleep(0.02)
            accepted.append(message["body"])

    async def run() -> None:
        response = ClosingStreamingResponse(producer.chunks(), media_type="text/event-stream", send_timeout_s=1.0)
        await asyncio.wait_for(response(dict(SCOPE), _never_disconnects, send), timeout=60)

    asyncio.run(run())
    assert len(accepted) == 60 and accepted[-1] == b"data: 59\n\n"
    assert producer.closed


def test_without_a_deadline_the_stream_is_sent_as_it_is() -> None:
    producer = Producer(5)
    accepted: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            accepted.append(message["body"])

    asyncio.run(ClosingStreamingResponse(producer.chunks(), media_type="text/event-stream")(
        dict(SCOPE), _never_disconnects, send))
    assert len(accepted) == 5 and producer.closed


def test_a_client_gone_mid_stream_ends_it_at_once_and_its_shielded_close_runs_whole() -> None:
    """Under ASGI 2.3 the body runs in the request's own task and a listener task cancels it when
    the client goes away: the stream ends at once, the iterator's shielded settlement runs to its
    end though it awaits (a cut that bypassed anyio's scopes would break it), and no listener is
    left behind."""
    settled: list[str] = []
    gone = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield b"data: 0\n\n"
            gone.set()
            await asyncio.Event().wait()  # the provider has nothing more yet
            yield b"data: 1\n\n"
        finally:  # as the gateway's relay settles: shielded (cancelled there, the charge would be lost)
            settled.append("started")
            with anyio.CancelScope(shield=True):
                await asyncio.sleep(0.05)
            settled.append("done")

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append(message["body"])

    async def run() -> set[asyncio.Task[Any]]:
        response = ClosingStreamingResponse(chunks(), media_type="text/event-stream", send_timeout_s=30)
        await asyncio.wait_for(response(dict(SCOPE), receive, send), timeout=5)
        await asyncio.sleep(0)  # a cancelled listener finishes on the loop's next turn
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    left = asyncio.run(run())
    assert sent == [b"data: 0\n\n"]
    assert settled == ["started", "done"]
    assert left == set()


def test_a_stream_that_ends_first_leaves_no_listener() -> None:
    producer = Producer(3)

    async def send(message: dict[str, Any]) -> None:
        return None

    async def run() -> set[asyncio.Task[Any]]:
        response = ClosingStreamingResponse(producer.chunks(), media_type="text/event-stream", send_timeout_s=30)
        await asyncio.wait_for(response(dict(SCOPE), _never_disconnects, send), timeout=5)
        await asyncio.sleep(0)
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    assert asyncio.run(run()) == set()
    assert producer.closed and producer.produced == 3
