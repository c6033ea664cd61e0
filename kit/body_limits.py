"""Bounded requests: what one HTTP request may make the gateway or a service hold, and for how long.

Enforced once, at the edge, by :class:`BodyLimits` (pure ASGI: it wraps ``receive``, so nothing
is buffered past a limit and streamed responses pass untouched), in the gateway app and in
every service app (kit/service_app.py):

* **size, per route class, while the body streams in** — a declared ``Content-Length`` over the
  limit is refused before a byte is read; a chunked body is counted as it arrives and refused
  (413 ``payload_too_large``) at the first chunk past the limit. Classes: JSON calls
  (``http.max_json_body_bytes``), uploads (``http.max_upload_body_bytes``: datasets, harness
  archives), sandbox file writes (``sandbox.max_file_transfer_mb``); see ``Operation.body_limit``;
* **a credential before the body** — the app's ``gate`` refuses (401) a request that presents
  none, before reading it (the gateway: a run key, a sandbox token or, on /admin/v1, the admin
  token itself; a service: the gateway's signature headers);
* **time** — the whole body must arrive within ``http.body_timeout_s`` of the request head, or
  the call is answered 408 ``request_timeout`` and the connection closed (a client trickling its
  body, slowloris). Request line and headers are bounded by the HTTP server (:func:`server_options`);
* **JSON shape** — a JSON body's tokens (commas, braces, brackets) are counted as it streams in
  and again before it is parsed (``http.max_json_tokens``: bounds the parse); the parsed body's
  nesting (``http.max_json_depth``) and values (``http.max_json_elements``: bounds what policy
  and the service's validation walk) are checked off the loop by :func:`parse_json_object`
  before policy work, so the cost of one request is bounded before it is spent.

Refusals never reach the ledger: they happen before a reservation is taken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kit.config import GymConfig, HttpConfig
from kit.errors import GymError, PayloadTooLarge, RequestTimeout, Unprocessable, error_response
from kit.http_protocol import GymHttpToolsProtocol
from kit.ids import new_request_id
from kit.request_json import loads_body

MiB = 1024 * 1024
FILES_FRAMING_BYTES = MiB
"""Room for multipart framing on top of a sandbox file write's own limit."""

RouteLimit = tuple[int, bool]
"""(most body bytes, whether the body is JSON whose tokens are counted while it streams)."""
Classifier = Callable[[str, str], RouteLimit]
"""(method, path) → the route's limit."""
Gate = Callable[[Scope, Headers], GymError | None]
"""A cheap check of the request head (no I/O): the refusal to answer before reading the body."""


def class_limit(config: GymConfig, kind: str) -> RouteLimit:
    """The byte limit of a route class (``Operation.body_limit``) and whether it counts JSON tokens."""
    if kind == "upload":
        return config.http.max_upload_body_bytes, False
    if kind == "files":
        return config.sandbox.max_file_transfer_mb * MiB + FILES_FRAMING_BYTES, False
    return config.http.max_json_body_bytes, True


def largest_limit(config: GymConfig) -> int:
    """The largest body any route class accepts (what a service, behind the gateway, bounds all its bodies by)."""
    return max(class_limit(config, kind)[0] for kind in ("json", "upload", "files"))


def server_options(config: GymConfig) -> dict[str, Any]:
    """uvicorn options for every server of the gym (``rsigym up`` / ``rsigym serve``): the gym's
    httptools protocol, whose request line and headers are bounded by ``http.max_header_bytes`` (431
    past it, in the gym's error shape: kit/http_protocol.py; uvicorn's one setting for a
    head's size carries the limit), and idle keep-alive connections closed after ``http.keep_alive_s``."""
    return {"http": GymHttpToolsProtocol, "h11_max_incomplete_event_size": config.http.max_header_bytes,
            "timeout_keep_alive": config.http.keep_alive_s}


def _declared_length(headers: Headers) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None  # the HTTP server refuses a malformed Content-Length itself


def _has_body(scope: Scope, headers: Headers) -> bool:
    declared = _declared_length(headers)
    return (declared or 0) > 0 or "transfer-encoding" in headers


def _is_json(headers: Headers) -> bool:
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return not kind or kind == "application/json" or kind.endswith("+json")


def count_tokens(chunk: bytes) -> int:
    """The commas, braces and brackets of ``chunk`` (C speed, no parse; strings included): an
    upper bound on the JSON elements it adds, and what a parse of it costs."""
    return chunk.count(b",") + chunk.count(b"{") + chunk.count(b"[")


CUT = {"Connection": "close"}
"""The headers of a refusal made while the body streams in: the rest of it is never read, so the
connection is closed after the answer, whichever handler answers (the app's, a route's past the
router, or :meth:`BodyLimits._refuse`). Without it a proxied call refused 408 left its connection
open until the keep-alive timeout, the trickling client's bytes read as the next request's."""


class _BoundedReceive:
    """``receive`` that refuses a body past its byte limit, its JSON token limit or its deadline."""

    def __init__(self, receive: Receive, limit: int, deadline: float, max_tokens: int | None):
        self.receive, self.limit, self.deadline, self.max_tokens = receive, limit, deadline, max_tokens
        self.received = self.tokens = 0
        self.done = False

    async def __call__(self) -> Message:
        if self.done:  # the body is in: later reads wait for the disconnect, unbounded
            return await self.receive()
        remaining = self.deadline - time.monotonic()
        message: Message | None = None
        if remaining > 0:
            try:  # asyncio's own timeout: a third of anyio's cancel scope's cost, on every read of every body
                async with asyncio.timeout(remaining):
                    message = await self.receive()
            except TimeoutError:
                pass
        if message is None:
            raise RequestTimeout("the request body did not arrive in time; send it at once", headers=dict(CUT))
        if message["type"] != "http.request":
            self.done = True
            return message
        chunk = message.get("body", b"")
        self.received += len(chunk)
        if self.received > self.limit:
            raise PayloadTooLarge(f"request body over {self.limit} bytes", headers=dict(CUT))
        if self.max_tokens is not None:
            self.tokens += count_tokens(chunk)
            if self.tokens > self.max_tokens:
                raise PayloadTooLarge(f"JSON body over {self.max_tokens} commas, braces and brackets", headers=dict(CUT))
        if not message.get("more_body", False):
            self.done = True
        return message


class BodyLimits:
    """The ASGI middleware (see the module docstring). Install it inside the request-id
    middleware, so its own refusals carry the request's id."""

    def __init__(self, app: ASGIApp, *, http: HttpConfig, classify: Classifier, gate: Gate | None = None,
                 on_refusal: Callable[[GymError], None] | None = None):
        self.app, self.http, self.classify, self.gate, self.on_refusal = app, http, classify, gate, on_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not _has_body(scope, headers):
            await self.app(scope, receive, send)
            return
        limit, counts_json = self.classify(scope["method"], scope["path"])
        refusal = self.gate(scope, headers) if self.gate is not None else None
        declared = _declared_length(headers)
        if refusal is None and declared is not None and declared > limit:
            refusal = PayloadTooLarge(f"request body of {declared} bytes is over this route's {limit}")
        if refusal is not None:
            await self._refuse(refusal, scope, receive, send)
            return
        max_tokens = self.http.max_json_tokens if counts_json and _is_json(headers) else None
        bounded = _BoundedReceive(receive, limit, time.monotonic() + self.http.body_timeout_s, max_tokens)
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded, watch)
        except (PayloadTooLarge, RequestTimeout) as err:  # an inner app without the gym's error handlers
            if started:
                raise
            await self._refuse(err, scope, receive, send)

    async def _refuse(self, err: GymError, scope: Scope, receive: Receive, send: Send) -> None:
        """The standard error, and the connection closed: the unread body is never read."""
        if self.on_refusal is not None:
            self.on_refusal(err)
        rid = scope.get("state", {}).get("request_id") or Headers(scope=scope).get("x-request-id") or new_request_id()
        response = error_response(err, rid)
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


def check_json_shape(value: Any, http: HttpConfig) -> None:
    """Refuse ``value`` when its objects and arrays nest deeper than ``max_json_depth`` or it holds
    more than ``max_json_elements`` values (objects, arrays, scalars); the walk stops at the
    first limit passed, so its own cost is bounded too."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 1
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > http.max_json_depth:
            raise PayloadTooLarge(f"JSON body nested over {http.max_json_depth} deep")
        seen += len(children)
        if seen > http.max_json_elements:
            raise PayloadTooLarge(f"JSON body over {http.max_json_elements} elements")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def parse_json_object(raw: bytes, http: HttpConfig, *, allows_nul: bool = False) -> dict[str, Any]:
    """A JSON object body within the size, token, depth and element limits, its strings text the
    gym can hold (kit/request_json.py: UTF-8, no lone surrogate, no NUL unless
    ``allows_nul``), or the standard refusal. The token count comes first (C speed, on the raw
    bytes), so a parse never starts on a body whose parse would be expensive; call it off the
    event loop (the parse holds the GIL for at most the time of ``max_json_tokens`` tokens)."""
    if len(raw) > http.max_json_body_bytes:
        raise PayloadTooLarge(f"request body over {http.max_json_body_bytes} bytes")
    if count_tokens(raw) > http.max_json_tokens:
        raise PayloadTooLarge(f"JSON body over {http.max_json_tokens} commas, braces and brackets")
    try:
        body = loads_body(raw, allows_nul=allows_nul)
    except RecursionError as err:
        raise PayloadTooLarge(f"JSON body nested over {http.max_json_depth} deep") from err
    except ValueError as err:
        raise Unprocessable("the request body must be JSON") from err
    if not isinstance(body, dict):
        raise Unprocessable("the request body must be a JSON object")
    check_json_shape(body, http)
    return body
