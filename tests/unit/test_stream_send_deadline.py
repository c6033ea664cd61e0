"""A streamed answer whose client stops accepting data is cut after ``send_timeout_s`` of one
send, and its body iterator is closed (the gateway settles and closes the upstream there); a
client that is slow on every chunk but never that slow on one gets the whole stream
(services/core/http.py: ``ClosingStreamingResponse``, ``SendDeadline``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from services.core.http import ClosingStreamingResponse

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
