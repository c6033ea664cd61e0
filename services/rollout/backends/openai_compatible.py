"""OpenAI-compatible upstreams by a direct httpx pass-through; everything else through LiteLLM.

For a model routed ``openai/<name>`` the request LiteLLM would send is already the request the
agent sent (the OpenAI chat schema, checked by ``parse_chat_request``): there is nothing to
translate. LiteLLM still spent ~10 ms of this 2-core box per call doing it (its request mapping,
response objects, logging worker) — most of what the rollout path added over a direct call
(``bench/gateway_overhead.py``, ``bench/gateway_vs_litellm.py``). Those models now go straight
to ``{api_base}/chat/completions`` on one pooled ``httpx.AsyncClient`` per event loop, streams
relayed chunk by chunk; models of other providers (``anthropic/…``, ``gemini/…``) keep LiteLLM.

What stays the same as on the LiteLLM path, and is tested on both: one attempt per metered call
(no retries), the provider key read at call time from ``api_key_env`` and sent only upstream, a
model whose key variable is unset refused without contacting the provider, provider errors
mapped by :func:`map_provider_error` (scrubbed, the operator's log line with the detail), the
stand-in provider served in-process (an ASGI transport, no network), usage taken from the
provider's own report (``stream_options.include_usage`` on streams).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import weakref
from collections.abc import AsyncIterator
from typing import Any

import httpx

from services.core.config import RolloutConfig, RolloutModel
from services.core.errors import GymError
from services.core.settings import ProviderSecrets
from services.rollout.backends.base import RolloutBackend
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


class _Clients:
    """One pooled client per event loop (a client's connections belong to the loop that opened them)."""

    def __init__(self, make: Any):
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._by_loop.get(loop)
        if client is None:
            client = self._by_loop[loop] = self._make()
        return client


class OpenAICompatibleBackend:
    """:class:`RolloutBackend` for ``openai/…`` models (see the module docstring)."""

    def __init__(self, config: RolloutConfig, secrets_: ProviderSecrets):
        self.config = config
        self.secrets = secrets_
        timeout = httpx.Timeout(config.request_timeout_s, connect=min(10.0, config.request_timeout_s))
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        # trust_env: proxy variables apply as they do for LiteLLM's own client.
        self._providers = _Clients(lambda: httpx.AsyncClient(timeout=timeout, limits=limits))
        self._standin_key = secrets.token_urlsafe(24)
        self._standin_app: Any = None
        self._standin = _Clients(self._standin_client)

    def _standin_client(self) -> httpx.AsyncClient:
        if self._standin_app is None:
            from services.rollout.standin import create_standin_app

            self._standin_app = create_standin_app(self._standin_key)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self._standin_app), trust_env=False,
                                 timeout=self.config.request_timeout_s)

    def _request(self, model: RolloutModel, request: ChatRequest, max_tokens: int, *, stream: bool) -> httpx.Request:
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
        return httpx.Request("POST", base.rstrip("/") + "/chat/completions", content=content, headers=headers)

    def _client(self, model: RolloutModel) -> httpx.AsyncClient:
        return self._standin.get() if model.served_by == "standin" else self._providers.get()

    async def _send(self, model: RolloutModel, request: httpx.Request, *, stream: bool) -> httpx.Response:
        try:
            response = await self._client(model).send(request, stream=stream)
        except httpx.HTTPError as err:
            raise map_provider_error(err, model) from None
        if response.status_code >= 400:
            try:
                body = await response.aread()
            except httpx.HTTPError:
                body = b""
            finally:
                await response.aclose()
            raise map_provider_error(ProviderStatusError(response.status_code, _detail(body)), model)
        return response

    async def complete(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        response = await self._send(model, self._request(model, request, max_tokens, stream=False), stream=False)
        try:
            payload = response.json()
        except ValueError:
            raise map_provider_error(ProviderStatusError(502, "the provider's answer is not JSON"), model) from None
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise map_provider_error(ProviderStatusError(502, "the provider's answer has no choices"), model)
        return payload

    async def stream(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        response = await self._send(model, self._request(model, request, max_tokens, stream=True), stream=True)
        return self._chunks(response, model)

    @staticmethod
    async def _chunks(response: httpx.Response, model: RolloutModel) -> AsyncIterator[dict[str, Any]]:
        try:
            async for line in response.aiter_lines():
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
        except httpx.HTTPError as err:
            raise map_provider_error(err, model) from None
        finally:
            await response.aclose()


class RoutedBackend:
    """``openai/…`` models by :class:`OpenAICompatibleBackend`, the others by LiteLLM."""

    def __init__(self, direct: RolloutBackend, litellm: RolloutBackend):
        self.direct, self.litellm = direct, litellm

    def _for(self, model: RolloutModel) -> RolloutBackend:
        return self.direct if is_openai_compatible(model) else self.litellm

    async def complete(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        return await self._for(model).complete(model, request, max_tokens)

    async def stream(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        return await self._for(model).stream(model, request, max_tokens)
