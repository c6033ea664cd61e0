"""The seam's in-process implementation (gateway/service_call.py): a proxied call to one of a
service's hot routes handed to that route's handler in process (embedded mode), with the
gateway's :class:`~kit.identity.Identity` itself; any other call goes on to the transport that
runs the service's whole app (:class:`DirectTransport`).

Through the in-process streaming transport (gateway/asgi_transport.py) a call is an httpx request,
a task that runs the service's whole ASGI app (its error, telemetry and body-limit middleware,
then its direct-route dispatcher), a queue, an httpx response. For the few routes a service serves
past its router (kit/direct_routes.py: the rollout service's chat completion, the sandbox's file
routes), the gateway calls that route's handler itself, in its own task. It is the same handler
the service's dispatcher would call, on a request whose scope is the one the transport builds
(decoded path, raw path, query, the headers, the body, the service's app), and the identity is in
the scope (``IN_PROCESS_IDENTITY``) instead of signed headers: nothing crosses a socket or the
transport, so there is no signature to check, and nothing a caller sends can set a scope key.

What is left out is what the gateway has already done:

* bounding the body: it is read, within the route's own limit, and the service's limit is the
  largest of the gateway's;
* refusing an unsigned caller before its body is read: this body is in memory, and vouched for.

A response returned whole (a JSON answer) comes back as it is (:class:`DirectResponse`). A streamed
one (an SSE completion: a ``StreamingResponse``) is read straight from its body iterator by the
gateway's relay (:class:`DirectStream`): it streams, holds its producer back (the producer makes a
chunk when the reader asks for one) and is closed when its reader goes away, as through the
transport, without a task, a queue, ASGI messages and an httpx response around each chunk. Any
other response (one with background work) still runs as an ASGI app through the transport. A
refusal is answered by the service's own exception handlers and an unexpected error by its
catch-all handler: the gateway sees the answer the service's app would have given.

Measured (docs/performance.md): 0.12-0.35 ms less of the gym process's CPU per sequential chat
completion, 0.5 ms less of what the gateway adds in ``gateway_vs_litellm.py``, and a stream's
first byte 0.2 ms sooner, read without the transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import StreamingResponse

from gateway.asgi_transport import SENDS_RAISE_WHEN_GONE, body_receive, http_scope, open_app
from gateway.service_call import ServiceCall, ServiceTransport, Upstream
from kit.direct_routes import Handler, error_answer
from kit.identity import IN_PROCESS_IDENTITY


class DirectResponse:
    """What the gateway's forward reads of an upstream response (the part of
    :class:`httpx.Response` it uses), for a body the handler returned whole."""

    def __init__(self, status_code: int, headers: Headers, content: bytes):
        self.status_code = status_code
        self.headers = headers
        self._content = content

    async def aread(self) -> bytes:
        return self._content

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self._content:
            yield self._content

    async def aclose(self) -> None:
        return None


class DirectStream:
    """What the gateway's forward reads of an upstream response, for a handler's streamed answer
    (a :class:`StreamingResponse`) read straight from its body iterator, in the reader's task.

    The same stream the transport would carry (:func:`gateway.asgi_transport.open_app`), without
    the task, the queue, the ASGI messages and httpx's response around each chunk. What the
    transport gave, this gives too:

    * the producer is held back: it makes a chunk only when the reader asks for one (the
      transport held at most ``QUEUE_CHUNKS``);
    * a reader that goes away stops it: :meth:`aclose` closes the body iterator, which the
      transport did by cancelling the app's task (the iterator's own ``finally`` runs either way);
    * an error in the producer after the start reaches the reader as an ``httpx`` transport error
      (``RemoteProtocolError``), as a service that breaks its stream off over the transport does.
    """

    def __init__(self, response: StreamingResponse):
        self.status_code = response.status_code
        self.headers = response.headers
        self._body = response.body_iterator
        self._charset = response.charset

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._body:  # bytes, memoryview or str, as Starlette takes them
                if chunk:
                    yield chunk.encode(self._charset) if isinstance(chunk, str) else bytes(chunk)
        except Exception as err:  # noqa: BLE001 - as over the transport: the app failed mid-response
            raise httpx.RemoteProtocolError(f"app failed mid-response: {type(err).__name__}") from err

    async def aclose(self) -> None:
        close = getattr(self._body, "aclose", None)
        if close is not None:
            await close()


class DirectService:
    """A service app of this process. ``app.state.direct_routes`` are the routes taken in process and
    ``app.state.direct_app`` the FastAPI app they belong to (both set by
    :func:`kit.service_app.create_service_app`; ``app`` may be another ASGI app around it)."""

    def __init__(self, app: Any, server: tuple[str, int], client: tuple[str, int] = ("127.0.0.1", 0)):
        self.app = getattr(app.state, "direct_app", app)
        self.routes: Mapping[tuple[str, str], Handler] = getattr(app.state, "direct_routes", None) or {}
        self.server = server
        self.client = client

    def handler(self, method: str, target: str, path: str) -> Handler | None:
        """The handler of a call to ``target`` (as it travels: percent-encoded path and query) whose
        decoded path is ``path``; None when the call must take the whole app (no direct route there,
        or a path or query that is not plain ASCII as it travels)."""
        if not self.routes or not target.isascii():
            return None
        if target.partition("?")[0] != path:
            return None
        return self.routes.get((method, path))

    async def call(self, handler: Handler, call: ServiceCall) -> DirectResponse | DirectStream | httpx.Response:
        """Run ``handler`` on ``call``, handed its identity as it is; see the module docstring.
        Returns a :class:`DirectResponse` (a whole answer), a :class:`DirectStream` (a streamed one)
        or, for an answer with background work, the transport's streaming :class:`httpx.Response`."""
        path, _, query = call.target.partition("?")
        raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in call.headers.items()]
        raw.append((b"content-length", str(len(call.body)).encode()))
        scope = http_scope(call.method, path, path.encode("ascii"), query.encode("ascii"),
                           [(b"host", self.server[0].encode("ascii")), *raw], self.client, self.server,
                           spec_version=SENDS_RAISE_WHEN_GONE)  # a streamed answer's send raises once its reader has gone
        scope["app"] = self.app
        scope[IN_PROCESS_IDENTITY] = call.identity
        request = Request(scope, body_receive(call.body, asyncio.Event()))  # a caller that stays
        try:
            response = await handler(request)
        except Exception as err:  # noqa: BLE001 - answered as the service's app answers it, or raised
            # No server-error middleware on this path: the app's catch-all handler answers an unexpected error.
            answered = await error_answer(request, err, catch_all=True)
            if answered is None:
                raise
            response = answered
        content = getattr(response, "body", None)
        if isinstance(content, bytes) and response.background is None:
            return DirectResponse(response.status_code, response.headers, content)
        if isinstance(response, StreamingResponse) and response.background is None:
            return DirectStream(response)
        return await open_app(response, scope, b"", None)


class DirectTransport:
    """The seam for a service of this process: a call to one of its hot routes is handed to the
    route's handler (:meth:`DirectService.call`), any other goes on to ``app_transport``, which
    runs the service's whole app (signed, as across any boundary)."""

    def __init__(self, service: DirectService, app_transport: ServiceTransport):
        self.service = service
        self.app_transport = app_transport

    async def send(self, call: ServiceCall) -> Upstream:
        handler = self.service.handler(call.method, call.target, call.path)
        if handler is None:
            return await self.app_transport.send(call)
        answer: Upstream = await self.service.call(handler, call)
        return answer
