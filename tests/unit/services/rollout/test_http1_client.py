"""The provider client (services/rollout/backends/http1.py) against scripted servers on loopback:
what a provider may do to a connection (close it, stall, send too much, send garbage, speak TLS)
and what the client must then do (reuse only a connection whose answer ended cleanly, never
retry, bound its waits and its memory, verify the provider's certificate)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from services.rollout.backends.http1 import (
    HIGH_WATER,
    MAX_HEAD_BYTES,
    Http1Pool,
    UpstreamConnectionError,
    UpstreamProtocolError,
    UpstreamReadTimeout,
    UpstreamRequestError,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A scripted server: ``handler`` serves each connection; ``connections`` counts them and
    ``requests`` holds each request's head and body as received."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.url = ""


async def read_request(reader: asyncio.StreamReader, server: Server) -> bool:
    """One request off the connection (False at its end)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    server.requests.append((head, await reader.readexactly(length)))
    return True


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body), extra, body)


@contextlib.asynccontextmanager
async def scripted(answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter, Server], Awaitable[None]],
                   tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server = Server()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            await answer(reader, writer, server)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    listening = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = listening.sockets[0].getsockname()[1]
    server.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1/chat/completions"
    async with listening:
        yield server
        listening.close()


async def keep_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
    while await read_request(reader, server):
        writer.write(ok())
        await writer.drain()


def pool(**kwargs: Any) -> Http1Pool:
    return Http1Pool(connect_s=kwargs.pop("connect_s", 2.0), read_s=kwargs.pop("read_s", 2.0), **kwargs)


@contextlib.asynccontextmanager
async def serving(answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter, Server], Awaitable[None]],
                  **kwargs: Any) -> AsyncIterator[tuple[Server, Http1Pool]]:
    """A scripted server and a client pool for it (closed at the end)."""
    async with scripted(answer) as server:
        client = pool(**kwargs)
        try:
            yield server, client
        finally:
            await client.close()


def test_calls_share_one_kept_alive_connection_and_send_what_was_asked() -> None:
    async def run() -> None:
        async with serving(keep_answering) as (server, client):
            for i in range(5):
                answer = await client.post(server.url, b'{"n":%d}' % i, {"authorization": "Bearer k"})
                assert (answer.status, await answer.read()) == (200, b'{"ok":true}')
            assert client.opened == 1 and server.connections == 1
            head, body = server.requests[-1]
            assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and body == b'{"n":4}'
            lines = head.lower().split(b"\r\n")
            assert b"authorization: bearer k" in lines and b"accept-encoding: identity" in lines
            assert b"host: 127.0.0.1:%d" % int(server.url.split(":")[2].split("/")[0]) in lines

    asyncio.run(run())


def test_a_connection_the_provider_closes_is_never_reused() -> None:
    """``Connection: close`` after an answer, or a close while the connection sat idle: the next
    call opens a new connection and succeeds; nothing is retried on a dead one."""

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        closing = len(server.requests) % 2 == 1
        writer.write(ok(extra=b"connection: close\r\n" if closing else b""))
        await writer.drain()
        # Either way the socket stays open a while, reading nothing more: said closed, or idle
        # until the provider closes it (the client is told of that close before its next call).
        await asyncio.sleep(0.3 if closing else 0.05)

    async def run() -> None:
        async with serving(answer_once, read_s=1.0) as (server, client):
            for i in range(4):
                answer = await client.post(server.url, b"{}", {})
                assert await answer.read() == b'{"ok":true}'
                await asyncio.sleep(0.2 if i % 2 else 0)  # the call after a "close" answer follows at once
            assert client.opened == 4 and server.connections == 4 and len(server.requests) == 4

    asyncio.run(run())


def test_a_stalled_provider_is_a_read_timeout_and_its_connection_is_dropped() -> None:
    async def stall_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")  # then nothing
        await writer.drain()
        await asyncio.sleep(1)

    async def run() -> None:
        async with serving(stall_second, read_s=0.3) as (server, client):
            answer = await client.post(server.url, b"{}", {})
            with pytest.raises(UpstreamReadTimeout):
                await answer.read()
            answer.release()
            assert client._idle.get(("http", "127.0.0.1", int(server.url.split(":")[2].split("/")[0]))) == []

    asyncio.run(run())


def test_a_silent_provider_times_out_before_its_head() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        await asyncio.sleep(1)

    async def run() -> None:
        async with serving(silent, read_s=0.3) as (server, client):
            with pytest.raises(UpstreamReadTimeout):
                await client.post(server.url, b"{}", {})

    asyncio.run(run())


def test_a_stream_left_unread_closes_its_connection_and_the_next_call_gets_a_fresh_one() -> None:
    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await read_request(reader, server):
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n")
            for i in range(3):
                event = b"data: %d\n\n" % i
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.02)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def run() -> None:
        async with serving(stream) as (server, client):
            answer = await client.post(server.url, b"{}", {})
            chunks = answer.chunks()
            assert await anext(chunks) == b"data: 0\n\n"
            await chunks.aclose()  # the reader went away mid-stream
            second = await client.post(server.url, b"{}", {})
            assert b"".join([c async for c in second.chunks()]) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
            third = await client.post(server.url, b"{}", {})  # the second was read whole: its connection again
            await third.read()
            assert client.opened == 2 and server.connections == 2

    asyncio.run(run())


def test_a_fast_stream_read_slowly_pauses_the_socket_and_arrives_whole() -> None:
    """Backpressure: the client holds at most about HIGH_WATER unread bytes, not the whole stream."""
    size = 16 * HIGH_WATER
    payload = bytes(range(256)) * (size // 256)

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for i in range(0, size, 65536):
            writer.write(payload[i:i + 65536])
            await writer.drain()

    async def run() -> None:
        async with serving(flood) as (server, client):
            answer = await client.post(server.url, b"{}", {})
            got, most = [], 0
            async for chunk in answer.chunks():
                got.append(chunk)
                most = max(most, answer._conn._buffered)
                await asyncio.sleep(0.001)
            assert b"".join(got) == payload
            assert most <= HIGH_WATER + 65536 * 4, most  # paused near the mark, not 4 MiB buffered

    asyncio.run(run())


@pytest.mark.parametrize(("reply", "why"), [
    (b"SPDY/9 banana\r\n\r\n", "not HTTP/1.1"),
    (b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (MAX_HEAD_BYTES + 1) + b"\r\ncontent-length: 0\r\n\r\n", "over the limit"),
    (b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nabc", "encoded"),
])
def test_an_answer_the_client_cannot_read_is_refused(reply: bytes, why: str) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(0.5)

    async def run() -> None:
        async with serving(answer) as (server, client):
            with pytest.raises(UpstreamProtocolError, match=why):
                await client.post(server.url, b"{}", {})
            assert not any(client._idle.values())

    asyncio.run(run())


def test_bytes_past_the_answer_make_the_connection_unusable() -> None:
    """A provider that sends a second answer to one request (a desynchronised connection) must
    not have it read as the answer to the next call."""

    async def twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await read_request(reader, server):
            writer.write(ok(b'{"n":1}') + ok(b'{"forged":true}'))
            await writer.drain()

    async def run() -> None:
        async with serving(twice) as (server, client):
            first = await client.post(server.url, b"{}", {})
            assert await first.read() == b'{"n":1}'
            await asyncio.sleep(0.05)
            second = await client.post(server.url, b"{}", {})
            assert await second.read() == b'{"n":1}'  # from a new connection, never the forged answer
            assert client.opened == 2

    asyncio.run(run())


def test_a_body_without_a_length_ends_with_the_connection_and_is_not_pooled() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"whole\":")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"true}")
        await writer.drain()

    async def run() -> None:
        async with serving(until_close) as (server, client):
            answer = await client.post(server.url, b"{}", {})
            assert await answer.read() == b'{"whole":true}'
            assert not any(client._idle.values())

    asyncio.run(run())


def test_a_provider_that_is_not_there_is_a_connection_error() -> None:
    from tests.fakes.servers import free_port

    async def run() -> None:
        with pytest.raises(UpstreamConnectionError):
            await pool().post(f"http://127.0.0.1:{free_port()}/v1/chat/completions", b"{}", {})

    asyncio.run(run())


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for 127.0.0.1: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test ca")).issuer_name(name("test ca"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(name("provider")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(2).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def test_https_verifies_the_providers_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TLS to an ``https://`` provider: a certificate the trust store does not vouch for is
    refused before the request (and its key) is sent; one it does is spoken to, and an operator
    points the trust store elsewhere with ``SSL_CERT_FILE`` (docs/operator-guide.md)."""
    ca, cert, key = _certificates(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)

    async def run() -> None:
        async with scripted(keep_answering, tls=served) as server:
            with pytest.raises(UpstreamConnectionError):
                await pool().post(server.url, b"{}", {"authorization": "Bearer secret"})  # the system's trust store
            assert server.requests == []
            trusting = ssl.create_default_context(cafile=str(ca))
            client = pool(ssl_context=trusting)
            answer = await client.post(server.url, b"{}", {"authorization": "Bearer secret"})
            assert (answer.status, await answer.read()) == (200, b'{"ok":true}')
            wrong_host = server.url.replace("127.0.0.1", "localhost")  # the certificate names 127.0.0.1 only
            with pytest.raises(UpstreamConnectionError):
                await client.post(wrong_host, b"{}", {})
            assert len(server.requests) == 1
            await client.close()
            monkeypatch.setenv("SSL_CERT_FILE", str(ca))
            by_environment = pool()
            answer = await by_environment.post(server.url, b"{}", {})
            assert (answer.status, await answer.read()) == (200, b'{"ok":true}')
            await by_environment.close()

    asyncio.run(run())


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async def run() -> None:
        async with serving(keep_answering) as (server, client):
            with pytest.raises(UpstreamRequestError):
                await client.post(server.url, b"{}", {"authorization": "Bearer k\r\nx-injected: 1"})
            assert server.connections == 0

    asyncio.run(run())


def test_a_provider_url_travels_as_a_request_line_and_host_header_can_carry_it() -> None:
    """What an operator may write as ``api_base``: a non-ASCII path is percent-encoded (what is
    encoded already stays), an IPv6 host is bracketed, a default port is left out of ``Host``."""
    from services.rollout.backends.http1 import _origin

    assert _origin("http://h:8080/v1/café/chat/completions?x=%20y") == (
        "http", "h", 8080, "/v1/caf%C3%A9/chat/completions?x=%20y", b"h:8080")
    assert _origin("http://[::1]:9000/v1")[1:] == ("::1", 9000, "/v1", b"[::1]:9000")
    assert _origin("https://API.example.com/v1")[1:] == ("api.example.com", 443, "/v1", b"api.example.com")
    for bad in ("ftp://h/v1", "http://h:99999/v1", "http://h:port/v1"):
        with pytest.raises(UpstreamRequestError):
            _origin(bad)
