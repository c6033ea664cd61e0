"""A lean HTTP/1.1 client for the provider's socket: pooled keep-alive connections, one request
written in one ``write``, the answer parsed by httptools (the C parser uvicorn serves the gym
with), its body read whole or chunk by chunk with backpressure.

Why not aiohttp, which did this before: its ``ClientSession._request`` and request and response
objects cost a call about twice this client's CPU (sequential keep-alive calls to the stand-in
provider, ``bench/provider_client.py``), and the gateway's added latency fell with it
(``bench/gateway_ab.py``, docs/performance.md). Everything a provider call needs of it is here; what is not (a proxy from
the environment) keeps aiohttp (services/rollout/backends/openai_compatible.py). The framing is
httptools's, a maintained C parser (llhttp) that uvicorn serves the gym with; what is written
here is the connection pool and its rules.

What it does and does not do, for a call that is billed once and never retried:

* **No retries.** A POST is not idempotent (RFC 9112 §9.3.1): a pooled connection that the
  provider closed as the request went out fails the call (``UpstreamConnectionError``), as it did
  with aiohttp. A connection the provider has closed while it sat idle is seen closed and dropped
  before it is used.
* **A connection is pooled again only when its answer was read to its end**, the provider kept it
  alive (HTTP/1.1, no ``Connection: close``) and nothing failed. An answer left unread (the
  caller went away mid-stream, a timeout, a parse error) closes its connection.
* **Timeouts**: opening a connection (TCP and TLS) within ``connect_s``; every wait for the
  provider's next bytes within ``read_s`` (aiohttp's ``sock_read``), so a long stream that keeps
  sending is never cut, and a silent provider is a ``UpstreamReadTimeout``.
* **TLS** for ``https://``, verified against the system's trust store (``ssl.create_default_context``:
  ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` honoured), the host name checked.
* **Bounds**: an answer's head above ``MAX_HEAD_BYTES`` is refused; a body read whole is the
  caller's to bound (as aiohttp's ``read()``); a stream's unread bytes above ``HIGH_WATER`` pause
  the socket until the reader takes them.
* ``Accept-Encoding: identity`` is sent, so the body is what was sent: an answer that comes
  encoded anyway is refused rather than passed on as garbage.
* Redirects are answers: a 3xx is returned as it is, never followed.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncGenerator
from functools import lru_cache
from urllib.parse import quote, urlsplit

import httptools

MAX_HEAD_BYTES = 64 * 1024
"""The most an answer's status line and headers may take."""
HIGH_WATER = 256 * 1024
"""Unread body bytes above which the socket stops reading until the reader catches up."""
MAX_IDLE = 64
"""Idle connections kept per origin; more are closed as they come back."""


class UpstreamConnectionError(Exception):
    """The provider could not be reached, or the connection broke before the answer ended."""


class UpstreamConnectTimeout(UpstreamConnectionError):
    """No connection (TCP and TLS) within the connect timeout (its name says Timeout: a 504)."""


class UpstreamReadTimeout(Exception):
    """No bytes came from the provider within the read timeout (the name says Timeout, which
    :func:`~services.rollout.backends.litellm_backend.map_provider_error` maps to a 504)."""


class UpstreamRequestError(Exception):
    """The request cannot be sent as configured (an ``api_base`` that is not an ``http(s)://`` URL
    with a valid port, a header value holding a line break): refused before anything is sent."""


class UpstreamProtocolError(Exception):
    """The provider's answer is not HTTP/1.1 this client reads (malformed, head too long, encoded)."""


@lru_cache(maxsize=256)
def _origin(url: str) -> tuple[str, str, int, str, bytes]:
    """(scheme, host, port, request target, Host header value) of an ``http(s)://`` URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamRequestError(f"not an http(s) URL: {parts.scheme}://")
    default = 443 if parts.scheme == "https" else 80
    try:
        port = parts.port or default
    except ValueError:  # a port out of range or not a number
        raise UpstreamRequestError("the provider's URL has no valid port") from None
    # As it travels: what is not ASCII percent-encoded, what already is (``%XX``) left as it is.
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe="/:@!$&'()*+,;=?%~")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return parts.scheme, parts.hostname, port, target, (host if port == default else f"{host}:{port}").encode("idna")


class _Connection(asyncio.Protocol):
    """One connection to a provider, reading one answer at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        """Ready to read one answer: a parser of its own and nothing read yet."""
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.done = False
        self.keep_alive = False
        self.error: Exception | None = None
        self._head_bytes = 0
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.done or self.error is not None:  # bytes past the answer, or past a failure
            self._spoil()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamProtocolError("the provider answered with a protocol upgrade"))
        except httptools.HttpParserError as err:
            if self.done:  # the answer ended whole; what came after it is no answer to anything
                self._spoil()
                return
            raised = err.__context__  # what a callback of ours raised, or None for the parser's own finding
            self._fail(raised if isinstance(raised, UpstreamProtocolError)
                       else UpstreamProtocolError(f"the provider's answer is not HTTP/1.1: {err}"))

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        ours, self.closed = self.closed, True
        if self.head_done and not self.done and self._close_delimited() and exc is None and not ours:
            self.done = True  # a body without a length ends with the connection
            self.keep_alive = False
            self._wake()
        elif not self.done:
            self._fail(UpstreamConnectionError("the provider closed the connection before its answer ended"))

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.head_done:  # a second answer to one request: stop parsing (data_received spoils the connection)
            raise UpstreamProtocolError("the provider sent bytes past its answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            raise UpstreamProtocolError("the provider's answer has a head over the limit")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self.status >= 200:
            self.head_done = True
            self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status < 200:  # an interim answer (103 Early Hints): the real one follows
            self.headers, self._head_bytes = [], 0
            return
        self.done = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # -- the caller's side -----------------------------------------------------------------

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def _close_delimited(self) -> bool:
        return self.header(b"content-length") is None and self.header(b"transfer-encoding") is None

    def _spoil(self) -> None:
        """Bytes came that no request asked for: the answer read so far stands, the connection goes."""
        self.keep_alive = False
        self.close()

    def _fail(self, err: Exception) -> None:
        if self.error is None:
            self.error = err
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, read_s: float) -> None:
        """Until the provider sends more (or the answer ends, or fails); at most ``read_s``."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(read_s):
                await self._waiter
        except TimeoutError:
            raise UpstreamReadTimeout(f"the provider sent nothing for {read_s:g} s") from None
        finally:
            self._waiter = None

    async def head(self, read_s: float) -> None:
        while not self.head_done:
            if self.error is not None:
                raise self.error
            await self._wait(read_s)
        encoding = self.header(b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
            self._fail(UpstreamProtocolError("the provider encoded its answer though asked for identity"))
            raise self.error  # type: ignore[misc]

    async def next_chunk(self, read_s: float) -> bytes | None:
        """The body's next bytes as they came (None at its end)."""
        while not self._body:
            if self.error is not None:
                raise self.error
            if self.done:
                return None
            await self._wait(read_s)
        chunk = self._body.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered <= HIGH_WATER // 4 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        return self.done and self.keep_alive and self.error is None and not self.closed and not self._body

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def start(self, request: bytes) -> None:
        """Send a request on this (idle) connection."""
        self._reset()
        assert self.transport is not None
        self.transport.write(request)


class Answer:
    """A provider's answer: ``status``, its headers, and its body once (:meth:`read` or :meth:`chunks`)."""

    def __init__(self, pool: Http1Pool, key: tuple[str, str, int], conn: _Connection):
        self._pool, self._key, self._conn = pool, key, conn
        self.status = conn.status
        self._released = False

    def header(self, name: str) -> str | None:
        value = self._conn.header(name.lower().encode("latin-1"))
        return None if value is None else value.decode("latin-1")

    async def chunks(self) -> AsyncGenerator[bytes]:
        """The body as it comes; the connection is given back at its end, or closed if left unread."""
        try:
            while (chunk := await self._conn.next_chunk(self._pool.read_s)) is not None:
                yield chunk
        finally:
            self.release()

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Give the connection back (pooled if its answer was read to its end, else closed). Idempotent."""
        if not self._released:
            self._released = True
            self._pool._give_back(self._key, self._conn)


class Http1Pool:
    """Keep-alive connections per origin, for one event loop (see the module docstring)."""

    def __init__(self, *, connect_s: float, read_s: float, ssl_context: ssl.SSLContext | None = None):
        self.connect_s, self.read_s = connect_s, read_s
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self.closed = False
        self.opened = 0
        """Connections opened so far (a figure for tests)."""

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        """POST ``body`` to ``url`` with ``headers`` (lower-case names; ``host``, ``content-length``
        and ``accept-encoding`` are set here). Returns once the answer's head has come."""
        if self.closed:
            raise UpstreamConnectionError("the provider client is closed")
        scheme, host, port, target, host_header = _origin(url)
        key = (scheme, host, port)
        head = [b"POST ", target.encode("latin-1"), b" HTTP/1.1\r\nhost: ", host_header,
                b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\naccept-encoding: identity\r\n"]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise UpstreamRequestError("a header may not hold a line break")
            head += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
        head += (b"\r\n", body)
        conn = self._take(key) or await self._open(scheme, host, port)
        conn.start(b"".join(head))
        try:
            await conn.head(self.read_s)
        except BaseException:
            conn.close()
            raise
        return Answer(self, key, conn)

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _open(self, scheme: str, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._tls() if scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_s):
                _transport, conn = await loop.create_connection(_Connection, host, port, ssl=tls,
                                                                server_hostname=host if tls else None)
        except TimeoutError:
            raise UpstreamConnectTimeout(f"no connection to the provider within {self.connect_s:g} s") from None
        except OSError as err:  # refused, unreachable, a name not found, a certificate that does not verify
            raise UpstreamConnectionError(f"cannot reach the provider: {type(err).__name__}") from None
        self.opened += 1
        return conn

    def _give_back(self, key: tuple[str, str, int], conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if self.closed or not conn.reusable() or len(idle) >= MAX_IDLE:
            conn.close()
        else:
            idle.append(conn)

    async def close(self) -> None:
        """Close every idle connection; one still in use closes when it is given back."""
        self.closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
