"""The gym's HTTP protocol writes a whole answer's head and body in one write (HeadWithBody):
the client gets one segment, not two. A stream, a HEAD answer, an empty body and a 100-continue
keep their writes as they were."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvicorn
from starlette.responses import JSONResponse, Response, StreamingResponse

from kit.body_limits import server_options
from kit.config import GymConfig
from kit.http_protocol import COALESCE_BYTES, HeadWithBody


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False


class Cycle:
    def __init__(self, method: str = "GET") -> None:
        self.scope: dict[str, Any] = {"method": method}
        self.response_started = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0


def started(cycle: Cycle, *, length: int | None) -> None:
    """What uvicorn's cycle has set when it writes the head."""
    cycle.response_started = True
    cycle.chunked_encoding = length is None
    cycle.expected_content_length = 0 if length is None else length


def test_a_body_of_known_length_goes_out_with_its_head() -> None:
    transport, cycle = Transport(), Cycle()
    door = HeadWithBody(transport, cycle)
    started(cycle, length=5)
    door.write(b"HEAD")
    assert transport.writes == []
    door.write(b"hello")
    assert transport.writes == [b"HEADhello"]
    door.write(b"more")  # later writes go straight through
    assert transport.writes == [b"HEADhello", b"more"]
    assert door.is_closing() is False  # the rest is the transport's


@pytest.mark.parametrize("method, length", [("GET", None), ("GET", 0), ("HEAD", 5)])
def test_a_stream_an_empty_body_or_a_head_request_writes_its_head_at_once(method: str, length: int | None) -> None:
    transport, cycle = Transport(), Cycle(method)
    door = HeadWithBody(transport, cycle)
    started(cycle, length=length)
    door.write(b"HEAD")
    assert transport.writes == [b"HEAD"]


def test_a_continue_before_the_answer_is_written_at_once() -> None:
    transport, cycle = Transport(), Cycle()
    door = HeadWithBody(transport, cycle)
    door.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # from receive(), before the response starts
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    started(cycle, length=2)
    door.write(b"HEAD")
    door.write(b"ok")
    assert transport.writes[1:] == [b"HEADok"]


def test_a_large_first_body_write_is_not_copied_onto_its_head() -> None:
    transport, cycle = Transport(), Cycle()
    door = HeadWithBody(transport, cycle)
    body = b"x" * (COALESCE_BYTES + 1)
    started(cycle, length=len(body))
    door.write(b"HEAD")
    door.write(body)
    assert transport.writes == [b"HEAD", body]
    assert transport.writes[1] is body


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/stream":
        async def chunks() -> Any:
            yield b"a"
            await asyncio.sleep(0.05)
            yield b"b"
        response: Response = StreamingResponse(chunks(), media_type="text/plain")
    else:
        response = JSONResponse({"answer": 42})
    await response(scope, receive, send)


def test_the_gym_server_answers_whole_and_streamed_over_one_connection(unused_port: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on the gym's server: a JSON answer, a HEAD request, a stream, then JSON again,
    on one kept-alive connection, each read whole and in order; a JSON answer left in one write."""
    sent: list[bytes] = []  # each write the server's transport was given
    wrap = HeadWithBody.__init__

    class Recorded:
        def __init__(self, transport: Any) -> None:
            self.transport = transport

        def write(self, data: bytes) -> None:
            sent.append(data)
            self.transport.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.transport, name)

    monkeypatch.setattr(HeadWithBody, "__init__", lambda self, transport, cycle: wrap(self, Recorded(transport), cycle))
    config = uvicorn.Config(app, host="127.0.0.1", port=unused_port, log_level="warning", lifespan="off",
                            **server_options(GymConfig()))
    server = uvicorn.Server(config)

    async def main() -> list[bytes]:
        task = asyncio.create_task(server.serve())
        while not server.started:  # noqa: ASYNC110 - uvicorn sets a flag, no event
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", unused_port)
        answers = []
        for method, path in (("GET", "/"), ("HEAD", "/"), ("GET", "/stream"), ("GET", "/")):
            writer.write(f"{method} {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            if method == "HEAD":
                answers.append(head)
            elif b"transfer-encoding: chunked" in head:
                answers.append(head + await reader.readuntil(b"0\r\n\r\n"))
            else:
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                answers.append(head + await reader.readexactly(length))
        writer.close()
        server.should_exit = True
        await task
        return answers

    whole, head_only, stream, again = asyncio.run(main())
    assert whole.startswith(b"HTTP/1.1 200 OK\r\n") and whole.endswith(b'{"answer":42}')
    assert head_only.startswith(b"HTTP/1.1 200 OK\r\n") and head_only.endswith(b"\r\n\r\n")
    assert stream.endswith(b"1\r\na\r\n1\r\nb\r\n0\r\n\r\n")
    assert again.endswith(b'{"answer":42}')
    assert whole in sent and again in sent  # head and body of each, one write


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
