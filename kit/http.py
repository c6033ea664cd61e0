"""What every app of the gym (gateway and services) shares at the HTTP edge:
error handlers that speak the one error shape, and request ids."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any
from urllib.parse import parse_qsl

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.telemetry import TelemetryConfig
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kit.display_text import inert
from kit.errors import (
    GymError,
    InternalError,
    InvalidRequest,
    NotFound,
    Unprocessable,
    error_response,
    storage_full,
)
from kit.ids import new_request_id
from kit.request_json import loads_body

log = logging.getLogger("rsigym.http")

NO_FASTAPI_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""``FastAPI(telemetry=...)`` for every app of the gym. The gym's own metrics are Prometheus
(gateway/metrics.py) and it sets up no OpenTelemetry provider, so FastAPI's native telemetry
would record nothing, yet with it left on FastAPI looks, for every request, whether a tracer,
meter or logger provider has been set since (three lookups in ``os.environ``): ~3.4 µs a request
warm, a few times that cold, 4–6 % of the gateway's Python time under py-spy (docs/performance.md)."""

_STATUS_ERRORS: dict[int, type[GymError]] = {404: NotFound, 405: InvalidRequest, 400: Unprocessable}
"""Framework refusals in the one error shape. A 400 from the framework is a body it could not
parse: it answers 422 like every other body that fails validation."""


class RequestIdMiddleware:
    """Gives every request an id (``request.state.request_id``) and every response the
    ``X-Request-Id`` header. Pure ASGI, so streamed responses pass through untouched."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        rid = state.setdefault("request_id", new_request_id())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    headers["X-Request-Id"] = state.get("request_id", rid)
            await send(message)

        await self.app(scope, receive, send_with_id)


class NulRefusal:
    """Refuses a request whose path or query holds NUL (``%00``) before any route reads it: no id or
    name of the gym holds one, and PostgreSQL cannot take it as a query parameter (a lookup of
    ``/records/v1/experiments/a%00b`` was a 500 there). A path is answered 404 ``not_found``
    like any other id that cannot exist, a query 422 naming its parameter. Pure ASGI; install it
    inside :class:`RequestIdMiddleware`, so the refusal carries the request's id."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            query = scope.get("query_string", b"")
            refusal: GymError | None = None
            if "\x00" in scope.get("path", ""):
                refusal = NotFound("not found: the path holds NUL (%00), which no id of the gym holds")
            elif b"%00" in query:
                names = [k for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if "\x00" in k + v]
                param = names[0] if names and "\x00" not in names[0] else None
                refusal = Unprocessable("a query parameter holds NUL (%00)", param=param)
            if refusal is not None:
                rid = scope.get("state", {}).get("request_id") or new_request_id()
                await error_response(refusal, rid)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event of an OpenAI-style stream (rollout's and inference's chat completions)."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def sse_events(piece: bytes) -> list[bytes]:
    """The events of a chunk of an SSE stream that holds whole events (as the gym's own streams
    are written: one or more ``…\n\n`` per chunk)."""
    return [e for e in piece.split(b"\n\n") if e.strip()]


def sse_data(event: bytes) -> Any:
    """An event's ``data:`` as JSON (None for ``[DONE]`` or an event without data)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            text = line[5:].strip()
            return None if text == b"[DONE]" else json.loads(text)
    return None


def request_id_of(request: Request) -> str:
    rid = getattr(request.state, "request_id", None)
    if rid is None:
        rid = request.state.request_id = new_request_id()
    return rid


def _validation_param(err: RequestValidationError) -> tuple[str | None, str]:
    errors = err.errors()
    if not errors:
        return None, "invalid request"
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
    param = ".".join(loc) or None
    return param, f"{param or 'request'}: {first.get('msg', 'invalid value')}"


def install_error_handlers(app: FastAPI, on_error: Callable[[GymError], None] | None = None) -> None:
    """``on_error`` sees every refusal (the gateway counts them by reason)."""

    @app.exception_handler(GymError)
    async def _gym_error(request: Request, exc: GymError) -> JSONResponse:
        if on_error is not None:
            on_error(exc)
        return error_response(exc, request_id_of(request))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        param, message = _validation_param(exc)
        return error_response(Unprocessable(message, param=param), request_id_of(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, GymError):  # a body model's JSON refused (TextJsonRoute): FastAPI wraps it in a 400
            return error_response(exc.__cause__, request_id_of(request))
        kind = _STATUS_ERRORS.get(exc.status_code, InvalidRequest)
        err = kind(str(exc.detail) if exc.detail else "request refused")
        response = error_response(err, request_id_of(request))
        response.status_code = err.status if exc.status_code == 400 else exc.status_code
        return response

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        rid = request_id_of(request)
        full = storage_full(exc)  # a full disk is the operator's to fix, and the caller should know it
        if full is not None:
            log.error("storage full in %s %s (%s): %s", request.method, inert(request.url.path), rid, inert(exc))
            return error_response(full, rid)
        log.error("unhandled error in %s %s (%s): %s", request.method, inert(request.url.path), rid, type(exc).__name__)
        return error_response(InternalError(f"internal error (request {rid})"), rid)


class _TextJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_body(await self.body())
        return self._json


class TextJsonRoute(APIRoute):
    """A route whose body model FastAPI reads from JSON text the gym can hold (``loads_body``:
    UTF-8, no lone surrogate, no NUL), refused 400/422 naming the field otherwise; Starlette's
    own ``Request.json`` takes all three. The routers of the gateway's own body models use it
    (``APIRouter(route_class=TextJsonRoute)``); the services read their bodies with :func:`json_object`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(_TextJsonRequest(request.scope, request.receive))

        return handle


async def json_object(request: Request, *, allows_nul: bool = False) -> dict[str, Any]:
    """The request body as a JSON object whose strings the gym can hold (no lone surrogate; no
    NUL unless ``allows_nul``: kit/request_json.py), or a 400/422 in the standard shape."""
    try:
        body = loads_body(await request.body(), allows_nul=allows_nul)
    except ValueError as err:
        raise Unprocessable("the request body must be JSON") from err
    if not isinstance(body, dict):
        raise Unprocessable("the request body must be a JSON object")
    return body


class SendDeadline:
    """Cuts a stream whose client takes longer than ``timeout_s`` to accept one chunk, by cancelling
    ``scope``: one timer per stream that looks at the send in progress when it fires, not a timer
    per chunk (``anyio.fail_after`` around each send cost ~9 µs a chunk here, ~0.3 ms of a
    35-event completion; this costs a clock read). A send that has run ``timeout_s`` when the timer
    fires is cut; otherwise the timer is set again for when the send in progress (or the next)
    would run out."""

    def __init__(self, timeout_s: float, scope: anyio.CancelScope):
        self.timeout_s, self.scope = timeout_s, scope
        self.cut = False
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None
        """When the send in progress began (the loop's clock); None between sends."""
        self._timer = self._loop.call_at(self._loop.time() + timeout_s, self._check)

    def timed(self, send: Send) -> Send:
        async def timed_send(message: Message) -> None:
            self._since = self._loop.time()
            await send(message)
            self._since = None

        return timed_send

    def _check(self) -> None:
        now = self._loop.time()
        if self._since is not None and now - self._since >= self.timeout_s:
            self.cut = True
            self.scope.cancel()
            return
        self._timer = self._loop.call_at((self._since if self._since is not None else now) + self.timeout_s,
                                         self._check)

    def stop(self) -> None:
        self._timer.cancel()


class ClosingStreamingResponse(StreamingResponse):
    """A streamed response that always closes its body iterator before it returns.

    Starlette cancels a stream whose client went away and leaves the iterator to the garbage
    collector, so its ``finally`` (stop the work, settle, close the upstream) would run at some
    later moment, after whoever waits on this response has moved on. Here it runs, shielded,
    before the response returns. ``send_timeout_s``: a client that takes longer than this to
    accept one chunk is cut (a reader that stopped reading; its producer was already held back
    by backpressure, this frees what it held; :class:`SendDeadline`).

    Under ASGI 2.3 (uvicorn's servers), Starlette runs the body in a task of an anyio task group
    while the request's task listens for the client going away. Here the body runs in the
    request's own task, inside one cancel scope that both the send deadline and a plain asyncio
    task listening for the disconnect cancel (:func:`_cancel_when_gone`): the same cut at the
    same moment, shields respected, for one task less and no task group per stream. Under 2.4 (a
    send raises once the client has gone: the gateway's in-process streams), Starlette's own."""

    def __init__(self, content: AsyncIterator[Any], *args: Any, send_timeout_s: float | None = None, **kw: Any):
        super().__init__(content, *args, **kw)
        self.send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        spec = tuple(int(part) for part in scope.get("asgi", {}).get("spec_version", "2.0").split("."))
        if scope["type"] != "http" or spec >= (2, 4):
            await super().__call__(scope, receive, send)
            return
        with anyio.CancelScope() as cut:
            listener = asyncio.get_running_loop().create_task(_cancel_when_gone(receive, cut))
            try:
                await self._stream(send, cut)
            finally:
                listener.cancel()
        if self.background is not None:
            await self.background()

    async def stream_response(self, send: Send) -> None:
        with anyio.CancelScope() as cut:
            await self._stream(send, cut)

    async def _stream(self, send: Send, cut: anyio.CancelScope) -> None:
        """The body, inside ``cut`` (which the send deadline cancels), its iterator closed after."""
        try:
            if self.send_timeout_s is None:
                await super().stream_response(send)
                return
            deadline = SendDeadline(self.send_timeout_s, cut)
            try:
                await super().stream_response(deadline.timed(send))
            finally:
                deadline.stop()
            if deadline.cut:
                log.info("stream cut: the client accepted no data for %s s", self.send_timeout_s)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()


async def _cancel_when_gone(receive: Receive, cut: anyio.CancelScope) -> None:
    """Cancel ``cut`` once the client has gone (``http.disconnect``), as Starlette's listener does;
    a ``receive`` that fails counts as gone. Cancelled itself when the stream ends first."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - whatever broke the connection ends the stream, as a disconnect does
        pass
    cut.cancel()
