"""The in-process transport's streamed responses (gateway/asgi_transport.py): a reader that stops
reading holds the app back, and a reader that closes early frees the app — whatever the app does
when it is cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.asgi_transport import QUEUE_CHUNKS, SENDS_RAISE_WHEN_GONE, StreamingASGITransport, http_scope, open_app


class Endless:
    """Streams without end, as a sandbox command's output does. Cancelled, it sends its end of
    stream first, as Connect RPC's server does (its ``finally`` sends the end message, then it
    raises ``ConnectError``), or only re-raises the cancellation."""

    def __init__(self, on_cancel: str):
        self.on_cancel = on_cancel
        self.sent = 0
        self.ended = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/connect+json")]})
        try:
            while True:
                await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": True})
                self.sent += 1
        except asyncio.CancelledError:
            if self.on_cancel == "raise":
                raise
            await send({"type": "http.response.body", "body": b"end of stream", "more_body": False})
            self.ended = True
            raise RuntimeError("the request was cancelled") from None


@pytest.mark.parametrize("on_cancel", ["send the end, then raise", "raise"])
def test_a_reader_that_stops_then_closes_frees_the_app(on_cancel: str) -> None:
    app = Endless("raise" if on_cancel == "raise" else "send")

    async def run() -> None:
        transport = StreamingASGITransport(app)
        response = await transport.handle_async_request(httpx.Request("POST", "http://service/stream", content=b"{}"))
        chunks = response.aiter_raw()
        assert await anext(chunks) == b"x" * 1024
        for _ in range(500):  # the reader reads nothing more: the app runs until the hand-over is full
            if app.sent > QUEUE_CHUNKS:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert QUEUE_CHUNKS < app.sent <= QUEUE_CHUNKS + 2  # held back, not running ahead
        # The reader goes away. Before the fix, an app that sends on its cancellation waited for
        # room in the full hand-over forever, and this close waited for the app.
        await asyncio.wait_for(response.aclose(), timeout=10)
        assert app.ended == (on_cancel != "raise")

    asyncio.run(run())


def test_a_spec_2_4_app_whose_reader_has_gone_is_told_so_by_its_send() -> None:
    """ASGI 2.4: once the reader has gone, a body ``send`` raises ``OSError`` instead of dropping
    the body (what Starlette's StreamingResponse relies on in place of a disconnect listener)."""
    app = Endless("send")
    errors: list[BaseException] = []

    async def told(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except BaseException as err:
            errors.append(err)
            raise

    async def run() -> None:
        scope = http_scope("POST", "/stream", b"/stream", b"", [], ("127.0.0.1", 0), ("service", 80),
                           spec_version=SENDS_RAISE_WHEN_GONE)
        response = await open_app(told, scope, b"{}", None)
        chunks = response.aiter_raw()
        assert await anext(chunks) == b"x" * 1024
        await asyncio.wait_for(response.aclose(), timeout=10)

    asyncio.run(run())
    assert not app.ended  # its end-of-stream send raised
    assert [type(err) for err in errors] == [OSError]
