"""Provider faults around the stand-in, for settlement tests.

Wraps the stand-in provider's ASGI app so the gym sees a real OpenAI-compatible server that
misbehaves the way real providers do: it bills more than the gym could have predicted
(``usage_factor``), it keeps the request and answers too late (``delay_s``), or it breaks a
stream off after it started generating (``break_after_chunks``). Everything else — auth,
protocol, bodies — is the stand-in's own.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

Scope = dict[str, Any]


class ProviderFaults:
    def __init__(self, app: Any, *, usage_factor: int = 1, delay_s: float = 0.0, break_after_chunks: int | None = None):
        self.app = app
        self.usage_factor = usage_factor
        self.delay_s = delay_s
        self.break_after_chunks = break_after_chunks
        self.received = 0
        """Chat requests that reached the provider (whether or not it answered)."""
        self.reported_usage: list[dict[str, int]] = []
        """The usage the provider billed, one entry per answered request."""

    @property
    def state(self) -> Any:
        return self.app.state

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        self.received += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        start: dict[str, Any] = {}
        buffered: list[bytes] = []
        chunks = 0

        async def relay(message: dict[str, Any]) -> None:
            nonlocal chunks
            if message["type"] == "http.response.start":
                start.update(message)
                if not self._is_json(message):
                    await send(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            if self._is_json(start):  # a plain completion: rewrite its usage once it is whole
                buffered.append(message.get("body", b""))
                if not message.get("more_body"):
                    body = self._rewrite_json(b"".join(buffered))
                    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                    headers.append((b"content-length", str(len(body)).encode()))
                    await send({**start, "headers": headers})
                    await send({"type": "http.response.body", "body": body})
                return
            chunks += 1
            if self.break_after_chunks is not None and chunks > self.break_after_chunks:
                raise ConnectionAbortedError("the provider broke the stream off")
            await send({**message, "body": self._rewrite_sse(message.get("body", b""))})

        await self.app(scope, receive, relay)

    @staticmethod
    def _is_json(start: dict[str, Any]) -> bool:
        return any(k.lower() == b"content-type" and v.startswith(b"application/json") for k, v in start.get("headers", []))

    def _scale(self, usage: dict[str, int]) -> dict[str, int]:
        prompt = usage["prompt_tokens"] * self.usage_factor
        completion = usage["completion_tokens"] * self.usage_factor
        scaled = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        self.reported_usage.append(scaled)
        return scaled

    def _rewrite_json(self, body: bytes) -> bytes:
        payload = json.loads(body)
        if isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
            payload["usage"] = self._scale(payload["usage"])
        return json.dumps(payload).encode()

    def _rewrite_sse(self, body: bytes) -> bytes:
        out = []
        for line in body.split(b"\n"):
            if line.startswith(b"data: {") and b'"usage"' in line:
                payload = json.loads(line[len(b"data: "):])
                if isinstance(payload.get("usage"), dict):
                    payload["usage"] = self._scale(payload["usage"])
                line = b"data: " + json.dumps(payload).encode()
            out.append(line)
        return b"\n".join(out)
