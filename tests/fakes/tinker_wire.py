"""A fake of Tinker's cloud that speaks Tinker's wire protocol, for the gym's Tinker pass-through.

There is no Tinker account here, so this stands in for Tinker's service
(``https://tinker.thinkingmachines.dev/services/tinker-prod``): the pass-through engine
(services/training/tinker_api/cloud_engine.py) talks to it with the real, unmodified ``tinker``
SDK, exactly as it would talk to Tinker. What answers is the gym's own Tinker API
(services/training/tinker_api: the same routes, JSON and protobuf bodies, futures and
long-polls the SDK speaks, trained by the local LoopEngine) of a second embedded gym, reached
in-process behind Tinker's URL layout (``<url>/api/v1/…``). So the protocol is the SDK's, not
ours: a call the fake answers is one the real SDK made and understood.

It accepts one fixed API key (:data:`FAKE_OPERATOR_KEY`, the platform's ``TINKER_API_KEY`` in the
tests) and answers any other with a 401; behind it, every call is made with the upstream gym's
own run key. It records each call it got (method, path, the API key presented), so a test can
assert the calls went upstream with the platform's key and never the agent's. :meth:`TinkerWire.fail`
makes the next call of a route fail as Tinker reports a failed request: the call is accepted
with a future, and retrieving it answers ``{"error", "category": "server"}``.

Tinker's own billing of the operator is not modelled beyond what the upstream gym meters on its key.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

FAKE_OPERATOR_KEY = "tml-fake-operator-key"
API_PREFIX = "/api/v1/"


@dataclass(frozen=True)
class WireCall:
    method: str
    route: str
    """The path after ``/api/v1/`` (``create_model``, ``forward_backward``, …)."""
    api_key: str | None


class TinkerWire:
    """An ASGI app: Tinker's wire protocol in front of ``gym_app``'s ``/tinker`` routes."""

    def __init__(self, gym_app: Any, upstream_run_key: str, api_key: str = FAKE_OPERATOR_KEY):
        self.gym_app = gym_app
        self.upstream_run_key = upstream_run_key
        self.api_key = api_key
        self.calls: list[WireCall] = []
        self._lock = threading.Lock()
        self._fail_next: dict[str, int] = {}
        self._failed: set[str] = set()

    def fail(self, route: str, times: int = 1) -> None:
        """The next ``times`` calls of ``route`` fail on Tinker's side (a server-category failed future)."""
        with self._lock:
            self._fail_next[route] = self._fail_next.get(route, 0) + times

    def routes(self) -> list[str]:
        with self._lock:
            return [c.route for c in self.calls]

    def keys_seen(self) -> set[str | None]:
        with self._lock:
            return {c.api_key for c in self.calls}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: the gym's own
            await self.gym_app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = [(k, v) for k, v in scope["headers"]]
        presented = next((v.decode() for k, v in headers if k.lower() == b"x-api-key"), None)
        if not path.startswith(API_PREFIX):
            await _json(send, 404, {"detail": "not found"})
            return
        route = path[len(API_PREFIX):]
        with self._lock:
            self.calls.append(WireCall(scope["method"], route, presented))
        if presented != self.api_key:
            await _json(send, 401, {"detail": "invalid API key"})
            return
        body = await _body(receive)
        with self._lock:
            failing = self._fail_next.get(route, 0) > 0
            if failing:
                self._fail_next[route] -= 1
                request_id = f"fake-failed-{len(self._failed)}"
                self._failed.add(request_id)
        if failing:
            await _json(send, 200, {"request_id": request_id, "model_id": None})
            return
        if route == "retrieve_future":
            try:
                asked = str(json.loads(body or b"{}").get("request_id"))
            except ValueError:
                asked = ""
            with self._lock:
                failed = asked in self._failed
            if failed:
                await _json(send, 200, {"error": "Internal server error (the fake's injected failure)",
                                        "category": "server"})
                return
        key = ("tml-" + self.upstream_run_key).encode()
        inner = dict(scope)
        inner["path"] = "/tinker" + path
        inner["raw_path"] = inner["path"].encode()
        inner["headers"] = [(k, key if k.lower() == b"x-api-key" else v) for k, v in headers
                            if k.lower() != b"authorization"]
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.gym_app(inner, replay, send)


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _json(send: Any, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
