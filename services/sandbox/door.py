"""The model door: a sandbox's only way out, and only to one service's model API.

A sandbox without network (an evaluation trial) may be given one door: the agent inside it
listens on 127.0.0.1:DOOR_PORT and relays each connection to a host-side Unix socket, which
this module serves. Here every HTTP request is parsed (h11, so keep-alive cannot smuggle a
second request past the check); only the door's own prefix is let through, to the gateway,
with the door's key put in place of whatever the caller sent. The key — scoped by the
platform to one model of that service — never enters the sandbox; anything else gets a 403
from the door itself.

Two kinds of door (:data:`PREFIXES`): an agent's sandbox gets ``inference`` (``/inference/v1/…``,
the evaluated model); a judged task's verifier gets ``rollout`` (``/rollout/v1/…``, the
benchmark's judge, on a key of the operator's). A judge door also keeps what was asked
(:class:`JudgeCapture`: the model and messages of each request, bounded), so the trial's
result can say what the judge was asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import h11
import httpx

log = logging.getLogger("rsigym.sandbox.door")
DOOR_PORT = 8700
ALLOWED_PREFIX = "/inference/v1/"
PREFIXES = {"inference": ALLOWED_PREFIX, "rollout": "/rollout/v1/"}
"""What each kind of door leads to (``rsigymDoor.service``)."""
MAX_BODY = 16 * 1024 * 1024
DENIED = "this sandbox's door leads to /inference/v1/ only"
CAPTURE_BYTES = 16 * 1024
"""The most of a judge door's requests kept (their JSON, model and messages only) per sandbox."""
RefusalHook = Callable[[str, str, str, str], None]
"""(sandbox id, method, path, rule) of a request the door refused; blocking (it writes a record)."""
_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "authorization", "x-api-key", "content-length",
        "proxy-authorization", "upgrade", "te", "trailer"}


def denied(prefix: str) -> str:
    return DENIED if prefix == ALLOWED_PREFIX else f"this sandbox's door leads to {prefix} only"


class JudgeCapture:
    """What a judge door was asked: each request's ``model`` and ``messages``, in order, until
    :data:`CAPTURE_BYTES` of them are kept; later ones are counted, not kept. Thread-safe enough
    for its one writer (the door's loop) and its readers (a view of the sandbox)."""

    def __init__(self, limit: int = CAPTURE_BYTES) -> None:
        self.limit = limit
        self.prompts: list[dict[str, Any]] = []
        self.calls = 0
        self.truncated = False
        self._bytes = 0

    def add(self, path: str, body: bytes) -> None:
        self.calls += 1
        try:
            sent = json.loads(body) if body else {}
        except ValueError:
            sent = {}
        sent = sent if isinstance(sent, dict) else {}
        entry = {"path": path[:200], "model": sent.get("model"), "messages": sent.get("messages")}
        size = len(json.dumps(entry, default=str))
        if self.truncated or self._bytes + size > self.limit:
            self.truncated = True
            return
        self.prompts.append(entry)
        self._bytes += size

    def view(self) -> dict[str, Any]:
        return {"calls": self.calls, "prompts": list(self.prompts), "truncated": self.truncated}


PLATFORM_STATUSES = frozenset({502, 503, 504})
"""Answers that say the platform, not the caller, failed a door's call: the gateway could not reach a
service, or it is unavailable or timed out. (A 500 is left out: a malformed request can cause one,
and a harness must not turn its own zero into a platform failure; 429 is the caller's own limit.)"""


@dataclass
class DoorFailures:
    """The calls a door could not carry because the platform failed (the gateway unreachable, or
    one of :data:`PLATFORM_STATUSES`): a trial whose harness met one is not scored as its zero
    (services/evaluation/trials.py)."""

    count: int = 0
    last: str = ""

    def add(self, what: str) -> None:
        self.count += 1
        self.last = what[:300]

    def view(self) -> dict[str, Any]:
        return {"count": self.count, "last": self.last}


class DoorServer:
    """One event loop thread serving every door of this process."""

    def __init__(self, on_refused: RefusalHook | None = None) -> None:
        self.on_refused = on_refused
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rsigym-sandbox-doors", daemon=True)
        self._thread.start()
        self._servers: dict[str, asyncio.base_events.Server] = {}
        self.captures: dict[str, JudgeCapture] = {}
        """What each open judge door (``capture=True``) was asked, by sandbox id."""
        self.failures: dict[str, DoorFailures] = {}
        """What each open door could not carry because the platform failed, by sandbox id."""
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(connect=5.0, read=900.0, write=60.0, pool=60.0))

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def open(self, sandbox_id: str, socket_path: str, gateway_url: str, key: str, owner: int | None = None,
             *, prefix: str = ALLOWED_PREFIX, capture: bool = False) -> None:
        """Serve the sandbox's door at ``socket_path``; ``owner``: the sandbox's host uid (None: it
        runs as the gym's own), the one uid besides the gym's that may connect. ``prefix``: the
        only paths let through (:data:`PREFIXES`); ``capture``: keep what is asked (a judge door)."""
        door = _Door(gateway_url.rstrip("/"), key, sandbox_id, prefix,
                     JudgeCapture() if capture else None, DoorFailures())

        async def start() -> None:
            if os.path.exists(socket_path):
                os.unlink(socket_path)
            server = await asyncio.start_unix_server(lambda r, w: self._serve(r, w, door), socket_path)
            if owner is not None:
                os.chown(socket_path, owner, owner)
            os.chmod(socket_path, 0o600)  # connecting needs write access: the sandbox's uid, no other user
            self._servers[sandbox_id] = server
            self.failures[sandbox_id] = door.failures
            if door.capture is not None:
                self.captures[sandbox_id] = door.capture

        self._run(start())

    def captured(self, sandbox_id: str) -> dict[str, Any] | None:
        """What the sandbox's judge door was asked so far; None for a sandbox without one."""
        capture = self.captures.get(sandbox_id)
        return capture.view() if capture is not None else None

    def failed(self, sandbox_id: str) -> dict[str, Any] | None:
        """The calls the sandbox's door could not carry because the platform failed; None without a door."""
        failures = self.failures.get(sandbox_id)
        return failures.view() if failures is not None else None

    def close(self, sandbox_id: str) -> None:
        async def stop() -> None:
            self.captures.pop(sandbox_id, None)
            self.failures.pop(sandbox_id, None)
            server = self._servers.pop(sandbox_id, None)
            if server is not None:
                server.close()

        self._run(stop())

    def shutdown(self) -> None:
        for sandbox_id in list(self._servers):
            self.close(sandbox_id)
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, door: _Door) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await _read_request(conn, reader)
                if request is None:
                    return
                await self._answer(conn, writer, request, body, door)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, ConnectionError, h11.LocalProtocolError, asyncio.IncompleteReadError):
            return
        finally:
            try:
                writer.close()
            except ConnectionError:
                pass

    async def _answer(self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes,
                      door: _Door) -> None:
        target = request.target.decode("latin-1")
        path = target.split("?", 1)[0]
        if not path.startswith(door.prefix) or ".." in path or "%2e" in path.lower():
            method = request.method.decode("latin-1")
            log.info("door of %s refused %s %s", door.sandbox_id, method, path)
            rule = denied(door.prefix)
            await self._report_refusal(door.sandbox_id, method, path, rule)
            await _send_json(conn, writer, 403, {"type": "error", "error": {
                "type": "permission_denied", "message": rule, "param": None}, "code": 403, "message": rule})
            return
        if door.capture is not None and request.method == b"POST":
            door.capture.add(path, body)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers
                   if k.decode("latin-1").lower() not in _HOP}
        headers["authorization"] = f"Bearer {door.key}"
        upstream_request = self._client.build_request(request.method.decode(), door.gateway + target,
                                                      headers=headers, content=body)
        try:
            upstream = await self._client.send(upstream_request, stream=True)
        except httpx.HTTPError as err:
            door.failures.add(f"the gateway is unreachable ({type(err).__name__})")
            await _send_json(conn, writer, 502, {"type": "error", "error": {
                "type": "upstream_error", "message": f"the gateway is unreachable ({type(err).__name__})",
                "param": None}})
            return
        if upstream.status_code in PLATFORM_STATUSES:
            door.failures.add(f"{request.method.decode()} {path}: HTTP {upstream.status_code}")
        try:
            out_headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP]
            writer.write(conn.send(h11.Response(status_code=upstream.status_code, headers=out_headers)))
            async for chunk in upstream.aiter_raw():
                writer.write(conn.send(h11.Data(data=chunk)))
                await writer.drain()
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        finally:
            await upstream.aclose()


    async def _report_refusal(self, sandbox_id: str, method: str, path: str, rule: str = DENIED) -> None:
        """Hand the refusal to the hook (off this loop: it writes to the store) before the 403
        goes out; a hook that fails is logged and never changes the answer."""
        if self.on_refused is None:
            return
        try:
            await asyncio.to_thread(self.on_refused, sandbox_id, method, path[:500], rule)
        except Exception:  # noqa: BLE001 - the record is best effort; the refusal stands regardless
            log.exception("door of %s: the refusal of %s %s was not recorded", sandbox_id, method, path)


@dataclass(frozen=True)
class _Door:
    """One open door: where it leads, with which key, and what it keeps of what is asked."""

    gateway: str
    key: str = field(repr=False)
    sandbox_id: str
    prefix: str
    capture: JudgeCapture | None
    failures: DoorFailures


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[h11.Request | None, bytes]:
    request: h11.Request | None = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)
            if not data and request is None:
                return None, b""
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise h11.RemoteProtocolError("request body too large")
        elif isinstance(event, h11.EndOfMessage):
            return request, body
        elif isinstance(event, h11.ConnectionClosed):
            return None, b""


async def _send_json(conn: h11.Connection, writer: asyncio.StreamWriter, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    writer.write(conn.send(h11.Response(status_code=status, headers=[
        ("content-type", "application/json"), ("content-length", str(len(data)))])))
    writer.write(conn.send(h11.Data(data=data)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
