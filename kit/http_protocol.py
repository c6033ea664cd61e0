"""The gym's HTTP/1.1 server protocol: uvicorn's httptools protocol (llhttp, in C), with the
request head bounded and every request it cannot parse refused in the gym's one error shape.

uvicorn refuses a malformed request line or header before any ASGI app runs, with a ``400`` in
plain text. Here the same refusal (same moment, same closed connection) is a JSON error body with
a request id, like every other error: a 431 ``request_header_too_large`` when the request line and
headers are over ``[http] max_header_bytes``, a 400 ``invalid_request_error`` otherwise. The
message never quotes the caller's bytes.

The head is bounded twice, because llhttp has no bound of its own and httptools gathers a header
it has not seen the end of in memory:

* while it streams in: the bytes before the blank line that ends it are counted read by read, so a
  head that never ends is refused once it passes the limit, having cost at most the limit and one
  read;
* when it is complete: the request line and headers as parsed, so a head that arrived whole in one
  read is measured too.

A whole answer's status line and headers leave in one write with its body (:class:`HeadWithBody`).

The gym ran uvicorn's h11 protocol (pure Python) for these bounds before; httptools parses the
same requests for less CPU per call (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from kit.errors import GymError, HeadTooLarge, InvalidRequest
from kit.ids import new_request_id

HEAD_END = b"\r\n\r\n"


class HeadWithBody:
    """A request's view of its connection's transport that sends a response's status line and
    headers in one write with the first bytes of its body, where that body is known to follow
    (a ``content-length`` over 0, not a HEAD request): uvicorn writes them as two, so its client
    took two TCP segments, and was woken twice, for every whole JSON answer. A response with no
    length (chunked: a stream, whose first chunk may be a long time coming) or no body has its
    head written at once, as before. Everything but ``write`` is the transport's own."""

    __slots__ = ("transport", "cycle", "head_sent", "held")

    def __init__(self, transport: Any, cycle: Any):
        self.transport, self.cycle = transport, cycle
        self.head_sent = False
        self.held = b""

    def write(self, data: bytes) -> None:
        cycle = self.cycle
        if not self.head_sent and cycle.response_started:  # this is the head: written as the response starts
            self.head_sent = True
            if cycle.chunked_encoding is False and cycle.expected_content_length > 0 and cycle.scope["method"] != "HEAD":
                self.held = data
                return
        if self.held:
            held, self.held = self.held, b""
            if len(data) <= COALESCE_BYTES:
                data = held + data
            else:  # a large body is not copied for it
                self.transport.write(held)
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


COALESCE_BYTES = 256 * 1024
"""A first body write up to this size is joined to the head (a copy); a larger one follows it."""


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop the parse (httptools re-raises it as a parser error)."""


class GymHttpToolsProtocol(HttpToolsProtocol):
    """The head's limit is uvicorn's ``h11_max_incomplete_event_size`` (``server_options`` sets it
    to ``[http] max_header_bytes``): the one setting uvicorn has for the size of a request head."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit: int | None = self.config.h11_max_incomplete_event_size
        self._in_head = True
        """Between requests, or reading a request line and headers (not yet their blank line)."""
        self._head_seen = 0
        self._head_tail = b""
        """The last bytes of the head so far, to find its end across reads."""
        self._too_large = False

    def data_received(self, data: bytes) -> None:
        if self._in_head and self.limit is not None:
            seen = self._head_tail + data
            end = seen.find(HEAD_END)
            if end < 0:
                self._head_seen += len(data)
                self._head_tail = seen[-(len(HEAD_END) - 1):]
            else:
                self._head_seen += end + len(HEAD_END) - len(self._head_tail)
            if self._head_seen > self.limit:
                self._too_large = True
                self.send_400_response("request head too long")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._in_head, self._head_seen, self._head_tail = False, 0, b""
        if self.limit is not None:
            line = len(self.parser.get_method()) + len(self.url) + len(b" HTTP/1.1\r\n") + 1
            if line + sum(len(name) + len(value) + 4 for name, value in self.headers) + 2 > self.limit:
                self._too_large = True
                raise _HeadTooLarge()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # its task has not run yet
            cycle.transport = cast(asyncio.Transport, HeadWithBody(self.transport, cycle))  # the transport, but for write

    def on_message_complete(self) -> None:
        self._in_head = True  # the next request's head, on a connection kept alive
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        refusal: GymError = (HeadTooLarge(f"the request line and headers are over {self.limit} bytes")
                             if self._too_large else InvalidRequest("the request line or a header is not valid HTTP/1.1"))
        cycle = self.cycle
        # An earlier request of this connection not answered yet (pipelined in the same read): the
        # refusal would read as its answer, so the connection is only closed.
        if cycle is None or cycle.response_complete:
            request_id = new_request_id()
            body = json.dumps(refusal.body(request_id), separators=(",", ":")).encode()
            self.transport.write(b"".join([
                STATUS_LINE[refusal.status],
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode() + b"\r\n",
                b"x-request-id: " + request_id.encode() + b"\r\n",
                b"connection: close\r\n\r\n",
                body]))
        self.transport.close()
