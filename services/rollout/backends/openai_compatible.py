"""OpenAI-compatible upstreams by a direct HTTP pass-through; everything else through LiteLLM.

For a model routed ``openai/<name>`` the request LiteLLM would send is already the request the
agent sent (the OpenAI chat schema, checked by ``parse_chat_request``): there is nothing to
translate. LiteLLM still spent ~10 ms of this 2-core box per call doing it (its request mapping,
response objects, logging worker) — most of what the rollout path added over a direct call
(``bench/gateway_overhead.py``, ``bench/gateway_vs_litellm.py``). Those models now go straight
to ``{api_base}/chat/completions`` on one pooled client per event loop, streams relayed chunk
by chunk; models of other providers (``anthropic/…``, ``gemini/…``) keep LiteLLM. The provider's
socket is :mod:`services.rollout.backends.http1`'s (keep-alive connections, httptools's C
parser): per sequential call to the stand-in provider it costs about half the CPU of aiohttp's
and a seventh of httpx's (``bench/provider_client.py``). A provider reached through a proxy the
environment names keeps aiohttp, which speaks to proxies. The stand-in served in this process
keeps httpx, whose ASGI transport calls it without a socket.

What stays the same as on the LiteLLM path, and is tested on both: one attempt per metered call
(no retries), the provider key read at call time from ``api_key_env`` and sent only upstream, a
model whose key variable is unset refused without contacting the provider, provider errors
mapped by :func:`map_provider_error` (scrubbed, the operator's log line with the detail), the
stand-in provider served in-process (an ASGI transport, no network), usage taken from the
provider's own report (``stream_options.include_usage`` on streams).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import secrets
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

import aiohttp
import httpx
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from kit.config import RolloutConfig, RolloutModel
from kit.errors import GymError
from kit.settings import ProviderSecrets
from services.rollout.backends.base import RolloutBackend
from services.rollout.backends.http1 import (
    Answer,
    Http1Pool,
    UpstreamConnectionError,
    UpstreamProtocolError,
    UpstreamReadTimeout,
    UpstreamRequestError,
)
from services.rollout.backends.litellm_backend import map_provider_error, provider_key
from services.rollout.schemas import ChatRequest

OPENAI_PREFIX = "openai/"
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"


def is_openai_compatible(model: RolloutModel) -> bool:
    return model.litellm_model.startswith(OPENAI_PREFIX)


class ProviderStatusError(Exception):
    """The provider answered with an HTTP error (mapped by :func:`map_provider_error`)."""

    def __init__(self, status_code: int, detail: str):
        super().__init__(f"status {status_code}: {detail}")
        self.status_code = status_code


def _detail(body: bytes) -> str:
    """The provider's own error message, when it sent the OpenAI error shape."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:400].decode(errors="replace")
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return json.dumps(payload)[:400]


log = logging.getLogger("rsigym.rollout")
C = TypeVar("C")
UPSTREAM_ERRORS = (httpx.HTTPError, aiohttp.ClientError, asyncio.TimeoutError, UpstreamConnectionError,
                   UpstreamReadTimeout, UpstreamProtocolError, UpstreamRequestError)
"""What a provider's connection raises (mapped by :func:`map_provider_error`; a timeout's name says so)."""
MAX_EVENT_BYTES = 16 * 1024 * 1024
"""The longest line of a provider's event stream read before the stream is refused as malformed."""


class _PerLoop(Generic[C]):
    """One pooled client per event loop (a client's connections belong to the loop that opened
    them), closed when its loop shuts down or by :meth:`close_all`.

    A loop may end before the gym does (a test client runs each request on a loop of its own):
    each client is tied to an async generator (its *keeper*) whose ``finally`` closes it. The
    loop's own shutdown (``loop.shutdown_asyncgens()``, run by ``asyncio.run`` and anyio before a
    loop closes) closes the keeper while the loop can still run the close."""

    def __init__(self, make: Callable[[], C], close: Callable[[C], Awaitable[None]]):
        self._make, self._close = make, close
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[C, AsyncGenerator[None]]] = (
            weakref.WeakKeyDictionary()
        )

    async def get(self) -> C:
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is None:
            client = self._make()
            keeper = self._closed_with_the_loop(client)
            await anext(keeper)  # started: the loop now knows it, and will close it at its end
            self._by_loop[loop] = found = (client, keeper)
        return found[0]

    async def _closed_with_the_loop(self, client: C) -> AsyncGenerator[None]:
        try:
            yield
        finally:
            await self._close(client)

    def items(self) -> list[tuple[asyncio.AbstractEventLoop, C]]:
        return [(loop, client) for loop, (client, _keeper) in list(self._by_loop.items())]

    def close_all(self) -> None:
        """Close the clients of every loop still running (from a thread other than those loops',
        as the gym's shutdown hooks run); a keeper already closed closes nothing twice."""
        for loop, (_client, keeper) in list(self._by_loop.items()):
            if loop.is_closed() or not loop.is_running():
                continue
            try:
                asyncio.run_coroutine_threadsafe(keeper.aclose(), loop).result(timeout=5)
            except (concurrent.futures.TimeoutError, RuntimeError) as err:
                log.warning("a provider client did not close: %s", type(err).__name__)


class _Answer:
    """A provider's answer, read the same way from an http1 answer (a provider), an aiohttp response
    (a provider behind a proxy) or an httpx one (the stand-in in this process)."""

    def __init__(self, response: Answer | aiohttp.ClientResponse | httpx.Response):
        self._response = response
        self.status = response.status_code if isinstance(response, httpx.Response) else response.status

    async def body(self) -> bytes:
        if isinstance(self._response, Answer | aiohttp.ClientResponse):
            return await self._response.read()
        return await self._response.aread()

    async def chunks(self) -> AsyncIterator[bytes]:
        if isinstance(self._response, Answer):
            async for chunk in self._response.chunks():
                yield chunk
        elif isinstance(self._response, aiohttp.ClientResponse):
            async for chunk in self._response.content.iter_any():
                yield chunk
        else:
            async for chunk in self._response.aiter_bytes():  # decoded, as aiohttp's are
                yield chunk

    async def lines(self) -> AsyncIterator[str]:
        """The stream's lines, split on \\n (a \\r before it dropped), each at most :data:`MAX_EVENT_BYTES`."""
        pending = b""
        async for chunk in self.chunks():
            pending += chunk
            *whole, pending = pending.split(b"\n")
            for line in whole:
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
            if len(pending) > MAX_EVENT_BYTES:
                raise ValueError("an event stream line over the limit")
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", errors="replace")

    async def close(self) -> None:
        if isinstance(self._response, Answer | aiohttp.ClientResponse):
            self._response.release()
        else:
            await self._response.aclose()


class OpenAICompatibleBackend:
    """:class:`RolloutBackend` for ``openai/…`` models (see the module docstring)."""

    def __init__(self, config: RolloutConfig, secrets_: ProviderSecrets):
        self.config = config
        self.secrets = secrets_
        # As httpx's timeout was: each read may wait request_timeout_s, a connect at most 10 s.
        connect_s = min(10.0, config.request_timeout_s)
        self._direct: _PerLoop[Http1Pool] = _PerLoop(
            lambda: Http1Pool(connect_s=connect_s, read_s=config.request_timeout_s), Http1Pool.close)
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_s, sock_read=config.request_timeout_s)
        # Not trust_env: it made every call read ~/.netrc and the proxy variables in two worker-
        # thread trips (~18 % of the gym's time per call), and a netrc entry for a provider's host
        # made each call fail (aiohttp refuses netrc auth beside an Authorization header). The
        # proxy variables still apply, read once per provider URL (:meth:`_proxy_for`); a provider
        # they send through a proxy is called with aiohttp, every other one with http1.
        self._providers: _PerLoop[aiohttp.ClientSession] = _PerLoop(lambda: aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=256), trust_env=False), aiohttp.ClientSession.close)
        self._proxies: dict[str, tuple[URL | None, aiohttp.BasicAuth | None]] = {}
        self._standin_key = secrets.token_urlsafe(24)
        self._standin_app: Any = None
        self._standin: _PerLoop[httpx.AsyncClient] = _PerLoop(self._standin_client, httpx.AsyncClient.aclose)

    def close(self) -> None:
        """Close the clients of every event loop still running (the rollout service's close hook)."""
        self._direct.close_all()
        self._providers.close_all()
        self._standin.close_all()

    def _standin_client(self) -> httpx.AsyncClient:
        if self._standin_app is None:
            from services.rollout.standin import create_standin_app

            self._standin_app = create_standin_app(self._standin_key)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self._standin_app), trust_env=False,
                                 timeout=self.config.request_timeout_s)

    def _request(self, model: RolloutModel, request: ChatRequest, max_tokens: int, *,
                 stream: bool) -> tuple[str, bytes, dict[str, str]]:
        """The provider's URL, the body and the headers of the call."""
        body: dict[str, Any] = {
            "model": model.litellm_model.removeprefix(OPENAI_PREFIX),
            "messages": request.message_dicts(),
            "max_tokens": max_tokens,
            **request.sampling_params(),
        }
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        key: str | None
        if model.served_by == "standin":
            base, key = "http://standin.internal/v1", self._standin_key
        else:
            key = provider_key(self.secrets, model)
            base = model.api_base or OPENAI_DEFAULT_BASE
        headers = {"content-type": "application/json", "accept": "text/event-stream" if stream else "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        content = json.dumps(body, separators=(",", ":")).encode()
        return base.rstrip("/") + "/chat/completions", content, headers

    async def _open(self, model: RolloutModel, url: str, content: bytes, headers: dict[str, str]) -> _Answer:
        if model.served_by == "standin":
            client = await self._standin.get()
            # The model's script (kit/config.py) is the stand-in's own configuration, keyed by the name
            # it is sent; set on each call, as this backend serves both the rollout and agent catalogues.
            self._standin_app.state.scripts[model.litellm_model.removeprefix(OPENAI_PREFIX)] = model.script or []
            return _Answer(await client.send(client.build_request("POST", url, content=content, headers=headers),
                                             stream=True))
        # No redirects followed (as with httpx): a provider's answer is the answer.
        proxy, proxy_auth = self._proxy_for(url)
        if proxy is None:
            pool = await self._direct.get()
            return _Answer(await pool.post(url, content, headers))
        session = await self._providers.get()
        return _Answer(await session.post(url, data=content, headers=headers, allow_redirects=False, proxy=proxy,
                                          proxy_auth=proxy_auth))

    def _proxy_for(self, url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        """The proxy the environment names for ``url`` (``HTTPS_PROXY`` / ``HTTP_PROXY``, ``NO_PROXY``
        honoured; its credentials from the URL or netrc), as aiohttp's ``trust_env`` finds it, read
        the first time the URL is called: the process's environment, as httpx reads it once per client."""
        found = self._proxies.get(url)
        if found is None:
            try:
                found = get_env_proxy_for_url(URL(url))
            except LookupError:  # none named, or NO_PROXY covers the host
                found = (None, None)
            except ValueError:  # no URL a request can go to (a port out of range, say): the operator's to mend
                raise UpstreamRequestError("the provider's URL is not valid") from None
            self._proxies[url] = found
        return found

    async def _send(self, model: RolloutModel, url: str, content: bytes, headers: dict[str, str]) -> _Answer:
        try:
            answer = await self._open(model, url, content, headers)
        except UPSTREAM_ERRORS as err:
            raise map_provider_error(err, model) from None
        if answer.status >= 400:
            try:
                body = await answer.body()
            except UPSTREAM_ERRORS:
                body = b""
            finally:
                await answer.close()
            raise map_provider_error(ProviderStatusError(answer.status, _detail(body)), model)
        return answer

    async def complete(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        answer = await self._send(model, *self._request(model, request, max_tokens, stream=False))
        try:
            body = await answer.body()
        except UPSTREAM_ERRORS as err:
            raise map_provider_error(err, model) from None
        finally:
            await answer.close()
        try:
            payload = json.loads(body)
        except ValueError:
            raise map_provider_error(ProviderStatusError(502, "the provider's answer is not JSON"), model) from None
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise map_provider_error(ProviderStatusError(502, "the provider's answer has no choices"), model)
        return payload

    async def stream(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        answer = await self._send(model, *self._request(model, request, max_tokens, stream=True))
        return self._chunks(answer, model)

    @staticmethod
    async def _chunks(answer: _Answer, model: RolloutModel) -> AsyncIterator[dict[str, Any]]:
        try:
            async for line in answer.lines():
                if not line.startswith("data:"):
                    continue  # SSE comments, event names, blank separators
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise map_provider_error(ProviderStatusError(502, "the provider sent a malformed stream event"),
                                             model) from None
                if isinstance(chunk, dict) and chunk.get("error"):
                    error = chunk["error"]
                    code = error.get("code") if isinstance(error, dict) else None
                    status = code if isinstance(code, int) else 502
                    raise map_provider_error(ProviderStatusError(status, _detail(json.dumps(chunk).encode())), model)
                if isinstance(chunk, dict):
                    yield chunk
            # A stream that ends without [DONE] was cut off: what the provider generated is unknown.
            raise map_provider_error(ProviderStatusError(502, "the provider's stream ended without [DONE]"), model)
        except GymError:
            raise
        except UPSTREAM_ERRORS as err:
            raise map_provider_error(err, model) from None
        except ValueError:  # a line past MAX_EVENT_BYTES
            raise map_provider_error(ProviderStatusError(502, "the provider sent a malformed stream event"),
                                     model) from None
        finally:
            await answer.close()


class RoutedBackend:
    """``openai/…`` models by :class:`OpenAICompatibleBackend`, the others by LiteLLM."""

    def __init__(self, direct: RolloutBackend, litellm: RolloutBackend):
        self.direct, self.litellm = direct, litellm

    def _for(self, model: RolloutModel) -> RolloutBackend:
        return self.direct if is_openai_compatible(model) else self.litellm

    def close(self) -> None:
        for backend in (self.direct, self.litellm):
            if (close := getattr(backend, "close", None)) is not None:
                close()

    async def complete(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        return await self._for(model).complete(model, request, max_tokens)

    async def stream(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        return await self._for(model).stream(model, request, max_tokens)
