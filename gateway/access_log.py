"""One access-log line per request the gateway answers: request id, key id, method, path, status,
cost, latency — as ``key=value`` text or as one JSON object per line (``[http] access_log``).

Pure ASGI around the whole app, so every answer is logged (proxied calls, admin and agent routes,
refusals, 404s) and a streamed response is logged once, when its last byte has gone, with the
time it took. No secret can reach the line: it holds no header but the gym's own cost header, and
the path without its query string; the key is named by its id, which the routes that
authenticate put in the request's state (:func:`note_key`).

The path is the caller's: decoded, it may hold a newline (``%0a``), a space or an escape
sequence. The text line writes each value as one token (kit/display_text.py:
``\x0a``, ``\x20``), so a request is always one line of known fields; JSON escapes on its own.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kit.display_text import log_token

log = logging.getLogger("rsigym.access")
COST_HEADER = b"x-rsigym-cost-usd"

AccessLogFormat = Literal["off", "text", "json"]


def note_key(request: Request, key_id: str) -> None:
    """Name the calling key in this request's access-log line."""
    request.state.key_id = key_id


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp, fmt: AccessLogFormat = "text"):
        self.app = app
        self.fmt = fmt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.fmt == "off":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        answer: dict[str, Any] = {"status": 500, "cost": None}

        async def send_noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == COST_HEADER:
                        answer["cost"] = value.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, send_noting)
        finally:
            if log.isEnabledFor(logging.INFO):
                self._line(scope, answer, started)

    def _line(self, scope: Scope, answer: dict[str, Any], started: float) -> None:
        state = scope.get("state") or {}
        fields = {"request_id": state.get("request_id"), "key_id": state.get("key_id"),
                  "method": scope.get("method"), "path": scope.get("path"), "status": answer["status"],
                  "cost_usd": answer["cost"], "latency_ms": round((time.perf_counter() - started) * 1000, 2)}
        log.info("%s", json.dumps(fields, separators=(",", ":")) if self.fmt == "json"
                 else " ".join(f"{k}={'-' if v is None else log_token(v)}" for k, v in fields.items()))


def show_access_log(fmt: AccessLogFormat) -> None:
    """Print the access log to stderr (the CLI's servers; a library caller configures logging itself)."""
    if fmt == "off" or any(getattr(h, "_rsigym_access", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s" if fmt == "json" else "%(asctime)s access %(message)s"))
    handler._rsigym_access = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
