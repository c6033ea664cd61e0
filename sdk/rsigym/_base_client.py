"""The request machinery shared by :class:`~rsigym.Gym` and :class:`~rsigym.AsyncGym`.

An endpoint is described once, without I/O, as an :class:`APICall` (method, path,
body, and how to parse the answer). Resources build calls; the clients run them.
Everything that is not I/O – configuration, headers, retry decisions, error mapping,
parsing – lives in :class:`BaseClient` and the modules it uses, so the sync and async
clients differ only in their short send loops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx
import pydantic

from . import _retry
from ._config import ENV_API_KEY, resolve_config
from ._streaming import AsyncStream, Stream
from ._version import __version__
from .errors import ConfigurationError, error_from_response, error_from_transport

__all__ = ["APICall", "BaseClient", "SyncAPIClient", "AsyncAPIClient", "DEFAULT_TIMEOUT", "DEFAULT_MAX_RETRIES"]

T = TypeVar("T")
C = TypeVar("C", bound=pydantic.BaseModel)

DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2


@dataclass(frozen=True, slots=True)
class APICall(Generic[T]):
    """One HTTP call to the gateway, described without doing it.

    ``parse`` turns a successful response into the SDK object; streaming calls leave it
    unset and are run with ``_stream`` instead of ``_request``.
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T] | None = None
    json: Any = None
    params: Mapping[str, Any] | None = None
    content: bytes | None = None
    """A raw body (e.g. a JSONL upload) instead of ``json``."""
    content_type: str | None = None


class BaseClient:
    """Configuration and the I/O-free half of every request."""

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout,
        max_retries: int,
    ) -> None:
        config = resolve_config(base_url, api_key)
        if config.api_key is None:
            raise ConfigurationError(f"no API key: pass api_key=... or set {ENV_API_KEY}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = config.base_url
        self._api_key = config.api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self._retry_policy = _retry.RetryPolicy(max_retries)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    def _headers(self, *, stream: bool) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._api_key}",
            "Accept": "text/event-stream" if stream else "application/json",
            "User-Agent": f"rsigym-sdk/{__version__}",
        }

    def _build_request(
        self, http: httpx.Client | httpx.AsyncClient, call: APICall[Any], *, stream: bool
    ) -> httpx.Request:
        # The gym's own timeout applies even to an injected http_client.
        headers = self._headers(stream=stream)
        if call.content_type:
            headers = {**headers, "Content-Type": call.content_type}
        return http.build_request(
            call.method,
            self.base_url + call.path,
            json=call.json,
            content=call.content,
            params=call.params,
            headers=headers,
            timeout=self.timeout,
        )

    @staticmethod
    def _parse(call: APICall[T], response: httpx.Response) -> T:
        if call.parse is None:
            raise TypeError(f"{call.method} {call.path} is a streaming call; run it with _stream()")
        return call.parse(response)


class SyncAPIClient(BaseClient):
    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)
        # A client passed in belongs to the caller, who closes it; ours we close.
        self._owns_http_client = http_client is None
        self._http_client = http_client if http_client is not None else httpx.Client(timeout=timeout)

    def _send(self, call: APICall[Any], *, stream: bool = False) -> httpx.Response:
        """Send with retries; return a 2xx response or raise the typed error."""
        retries_done = 0
        while True:
            request = self._build_request(self._http_client, call, stream=stream)
            try:
                response = self._http_client.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = self._retry_policy.delay_after_exception(call.method, exc, retries_done)
                if delay is None:
                    raise error_from_transport(exc) from exc
            else:
                if response.is_success:
                    return response
                delay = self._retry_policy.delay_after_status(response, retries_done)
                try:
                    response.read()
                except httpx.TransportError as exc:
                    raise error_from_transport(exc) from exc
                finally:
                    response.close()
                if delay is None:
                    raise error_from_response(response)
            _retry.sleep(delay)
            retries_done += 1

    def _request(self, call: APICall[T]) -> T:
        return self._parse(call, self._send(call))

    def _stream(self, call: APICall[Any], item_type: type[C]) -> Stream[C]:
        return Stream(self._send(call, stream=True), item_type)

    @property
    def is_closed(self) -> bool:
        return self._http_client.is_closed

    def close(self) -> None:
        """Close the HTTP connection pool (only if this client created it)."""
        if self._owns_http_client:
            self._http_client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncAPIClient(BaseClient):
    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)
        self._owns_http_client = http_client is None
        self._http_client = http_client if http_client is not None else httpx.AsyncClient(timeout=timeout)

    async def _send(self, call: APICall[Any], *, stream: bool = False) -> httpx.Response:
        """Send with retries; return a 2xx response or raise the typed error."""
        retries_done = 0
        while True:
            request = self._build_request(self._http_client, call, stream=stream)
            try:
                response = await self._http_client.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = self._retry_policy.delay_after_exception(call.method, exc, retries_done)
                if delay is None:
                    raise error_from_transport(exc) from exc
            else:
                if response.is_success:
                    return response
                delay = self._retry_policy.delay_after_status(response, retries_done)
                try:
                    await response.aread()
                except httpx.TransportError as exc:
                    raise error_from_transport(exc) from exc
                finally:
                    await response.aclose()
                if delay is None:
                    raise error_from_response(response)
            await _retry.async_sleep(delay)
            retries_done += 1

    async def _request(self, call: APICall[T]) -> T:
        return self._parse(call, await self._send(call))

    async def _stream(self, call: APICall[Any], item_type: type[C]) -> AsyncStream[C]:
        return AsyncStream(await self._send(call, stream=True), item_type)

    @property
    def is_closed(self) -> bool:
        return self._http_client.is_closed

    async def close(self) -> None:
        """Close the HTTP connection pool (only if this client created it)."""
        if self._owns_http_client:
            await self._http_client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
