"""uvicorn's h11 protocol, answering a request it cannot parse in the gym's one error shape.

uvicorn refuses a malformed request line or header — and a head still incomplete past h11's
``max_incomplete_event_size``, set to ``[http] max_header_bytes`` — before any ASGI app runs, with a
``400`` in plain text whatever h11 said. Here the same refusal (same moment, same closed connection)
is a 431 ``request_header_too_large`` when the head is too long and a 400 ``invalid_request_error``
otherwise, as a JSON error body with a request id, like every other error. A head that arrived
whole in one read is measured too: h11 alone would let it through at any size a read can hold.
"""

from __future__ import annotations

import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from services.core.errors import GymError, HeadTooLarge, InvalidRequest
from services.core.ids import new_request_id


def _head_bytes(request: h11.Request) -> int:
    """The request line and headers as they came, less whitespace h11 trimmed."""
    line = len(request.method) + len(request.target) + len(b" HTTP/1.1\r\n") + 1
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items()) + 2


class GymH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused: h11.RemoteProtocolError | None = None
        parse = self.conn.next_event
        limit = self.limit = self.config.h11_max_incomplete_event_size

        def next_event() -> Any:  # uvicorn drops the error before its answer: keep it for that answer
            try:
                event = parse()
                if isinstance(event, h11.Request) and limit is not None and _head_bytes(event) > limit:
                    # h11 bounds only a head still incomplete: one that arrived in one read
                    # (up to a socket read, 64 KiB and more) would pass whole.
                    raise h11.RemoteProtocolError("request head too long", error_status_hint=431)
                return event
            except h11.RemoteProtocolError as err:
                self._refused = err
                raise

        self.conn.next_event = next_event  # type: ignore[method-assign]

    def send_400_response(self, msg: str) -> None:
        err = self._refused
        refusal: GymError = (
            HeadTooLarge(f"the request line and headers are over {self.limit} bytes")
            if err is not None and err.error_status_hint == 431
            # h11's own message may quote the offending line: the caller's bytes are not echoed back.
            else InvalidRequest("the request line or a header is not valid HTTP/1.1"))
        request_id = new_request_id()
        body = json.dumps(refusal.body(request_id), separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"x-request-id", request_id.encode()), (b"connection", b"close")]
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.write(self.conn.send(h11.Response(status_code=refusal.status, headers=headers)) or b"")
            self.transport.write(self.conn.send(h11.Data(data=body)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        self.transport.close()
