"""Fixtures for the SDK tests: a fake gateway speaking the server's HTTP shapes.

The fake is an ``httpx.MockTransport`` handler: routes map ``(method, path)`` to a
callable returning an ``httpx.Response`` (or raising an httpx transport error), and
every request is recorded so tests can assert what the SDK actually sent.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

if importlib.util.find_spec("rsigym") is None:  # not installed and PYTHONPATH unset
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "sdk"))

import rsigym
from rsigym import _retry

API_KEY = "rsg_test_key"
BASE_URL = "http://gym.test"

Handler = Callable[[httpx.Request], httpx.Response]


class ChunkedStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body delivered in exactly the given pieces (sync and async)."""

    def __init__(self, chunks: Iterable[bytes], fail_with: Exception | None = None) -> None:
        self.chunks = list(chunks)
        self.fail_with = fail_with
        self.closed = False
        self.delivered = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.delivered += 1
            yield chunk
        if self.fail_with is not None:
            raise self.fail_with

    async def __aiter__(self):  # type: ignore[override]
        for chunk in self:
            yield chunk

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


class FakeGateway:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Handler | list[Handler]] = {}
        self.requests: list[httpx.Request] = []

    # -- building answers -----------------------------------------------------------
    @staticmethod
    def ok(
        body: Any,
        *,
        request_id: str = "req_ok",
        cost: str | None = None,
        remaining: str | None = None,
        status: int = 200,
    ) -> httpx.Response:
        headers = {"X-Request-Id": request_id}
        if cost is not None:
            headers["X-RSIGym-Cost-USD"] = cost
        if remaining is not None:
            headers["X-RSIGym-Remaining-USD"] = remaining
        return httpx.Response(status, json=body, headers=headers)

    @staticmethod
    def error(
        status: int,
        type_: str,
        message: str,
        *,
        param: str | None = None,
        request_id: str = "req_err",
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        body = {"type": "error", "error": {"type": type_, "message": message, "param": param}, "request_id": request_id}
        return httpx.Response(status, json=body, headers={"X-Request-Id": request_id, **(headers or {})})

    @staticmethod
    def sse(
        chunks: Iterable[bytes],
        *,
        request_id: str = "req_stream",
        cost: str | None = None,
        remaining: str | None = None,
        stream: ChunkedStream | None = None,
    ) -> httpx.Response:
        """A stream as the gateway relays it: the cost header is the reserved upper bound."""
        headers = {"X-Request-Id": request_id, "Content-Type": "text/event-stream"}
        if cost is not None:
            headers["X-RSIGym-Cost-USD"] = cost
            headers["X-RSIGym-Cost-Kind"] = "reserved-upper-bound"
        if remaining is not None:
            headers["X-RSIGym-Remaining-USD"] = remaining
        return httpx.Response(200, headers=headers, stream=stream or ChunkedStream(chunks))

    # -- routing ----------------------------------------------------------------------
    def route(self, method: str, path: str, *answers: httpx.Response | Handler | Exception) -> None:
        """Answer successive calls with ``answers`` in order; the last one repeats."""
        self.routes[(method, path)] = [self._as_handler(a) for a in answers]

    @staticmethod
    def _as_handler(answer: httpx.Response | Handler | Exception) -> Handler:
        if isinstance(answer, Exception):

            def raise_it(request: httpx.Request) -> httpx.Response:
                raise answer

            return raise_it
        if isinstance(answer, httpx.Response):
            if isinstance(answer.stream, ChunkedStream):  # a stream can be answered once
                return lambda request: answer
            # a fresh copy per call: one Response object must not serve two requests
            return lambda request: httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)
        return answer

    def calls(self, method: str, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method and r.url.path == path]

    def json_sent(self, index: int = -1) -> Any:
        return json.loads(self.requests[index].content)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        handlers = self.routes.get((request.method, request.url.path))
        if handlers is None:
            return self.error(404, "not_found", f"no route {request.method} {request.url.path}")
        n = len(self.calls(request.method, request.url.path)) - 1
        return handlers[min(n, len(handlers) - 1)](request)

    # -- clients ----------------------------------------------------------------------
    def gym(self, **kwargs: Any) -> rsigym.Gym:
        kwargs.setdefault("base_url", BASE_URL)
        kwargs.setdefault("api_key", API_KEY)
        return rsigym.Gym(http_client=httpx.Client(transport=httpx.MockTransport(self)), **kwargs)

    def async_gym(self, **kwargs: Any) -> rsigym.AsyncGym:
        kwargs.setdefault("base_url", BASE_URL)
        kwargs.setdefault("api_key", API_KEY)
        return rsigym.AsyncGym(http_client=httpx.AsyncClient(transport=httpx.MockTransport(self)), **kwargs)


@pytest.fixture
def gateway() -> FakeGateway:
    return FakeGateway()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own RSIGYM_* variables must not leak into tests."""
    monkeypatch.delenv("RSIGYM_URL", raising=False)
    monkeypatch.delenv("RSIGYM_API_KEY", raising=False)


@pytest.fixture(autouse=True)
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Retry waits are recorded instead of slept, so retry tests are instant."""
    recorded: list[float] = []

    async def fake_async_sleep(seconds: float) -> None:
        recorded.append(seconds)

    monkeypatch.setattr(_retry, "sleep", recorded.append)
    monkeypatch.setattr(_retry, "async_sleep", fake_async_sleep)
    return recorded


@pytest.fixture
def chunked_stream() -> type[ChunkedStream]:
    return ChunkedStream


# Canned bodies in the server's shapes --------------------------------------------------

BALANCE = {"budget_usd": 5.0, "spent_usd": 1.7, "reserved_usd": 0.09, "remaining_usd": 3.21}

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "teacher",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "cost_usd": 0.000123},
    "system_fingerprint": "fp_local",
}

MODELS = {
    "object": "list",
    "data": [
        {
            "id": "teacher",
            "object": "model",
            "owned_by": "rsigym",
            "pricing": {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0},
        },
        {"id": "tiny-local", "object": "model", "owned_by": "rsigym"},
    ],
}


def chunk(
    content: str | None = None,
    *,
    role: str | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A chunk as the rollout service relays it; the usage chunk has no id / created."""
    if usage is not None:
        return {"object": "chat.completion.chunk", "model": "teacher", "choices": [], "usage": usage}
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "teacher",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def sse_event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@pytest.fixture
def canned() -> dict[str, Any]:
    return {"balance": BALANCE, "completion": COMPLETION, "models": MODELS, "chunk": chunk, "sse_event": sse_event}
