"""Rollout through LiteLLM: any OpenAI-compatible or native provider in the catalogue.

The provider key is read from the platform's environment at call time (``api_key_env``),
passed to LiteLLM for that one call and never returned, logged or stored. Provider errors
are mapped to gym errors with scrubbed messages.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx

from kit.config import RolloutConfig, RolloutModel
from kit.errors import GymError, Unprocessable, UpstreamError, UpstreamRateLimited, UpstreamTimeout
from kit.redact import redact
from kit.settings import ProviderSecrets
from services.rollout.schemas import ChatRequest


def _litellm() -> Any:
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


log = logging.getLogger("rsigym.rollout")


def map_provider_error(err: Exception, model: RolloutModel | None = None) -> GymError:
    """The gym error an agent gets for a provider failure (naming the model), and a log line for the
    operator with what the agent is not shown: provider, status and the (redacted) detail."""
    status = getattr(err, "status_code", None)
    text = redact(str(err))[:400]
    name = type(err).__name__
    if model is not None:
        log.warning("rollout model %r (%s): the provider failed: %s, status %s: %s", model.name, model.litellm_model,
                    name, status, text)
    which = f"model {model.name!r}: " if model is not None else ""
    if "Timeout" in name:
        return UpstreamTimeout(f"{which}the provider did not answer in time")
    if status in (400, 413, 422):
        return Unprocessable(f"{which}the provider refused the request: {text}")
    if status == 429:
        return UpstreamRateLimited(f"{which}the provider is rate limiting; retry later", headers={"Retry-After": "5"})
    if status in (401, 403):
        return UpstreamError(f"{which}the provider refused the platform's credentials; tell the gym operator")
    return UpstreamError(f"{which}the provider failed ({name}, status {status})")


def provider_key(secrets: ProviderSecrets, model: RolloutModel) -> str | None:
    """The platform's key for ``model``'s provider, read now from ``api_key_env`` (None when the
    model names none); a model whose key variable is unset or empty is refused, unbilled, without
    contacting the provider."""
    secret = secrets.get(model.api_key_env)
    if model.api_key_env and not secret:
        log.warning("rollout model %r (%s): %s is not set; refused without calling the provider",
                    model.name, model.litellm_model, model.api_key_env)
        raise UpstreamError(f"model {model.name!r} has no provider key configured; tell the gym operator")
    return secret


class _StandinClient:
    """The offline stand-in provider (``served_by = "standin"``) inside this process: an OpenAI
    client whose transport is the stand-in's ASGI app, handed to LiteLLM per call, so a stand-in
    model goes through the same LiteLLM path (request mapping, streaming, usage) as a real one."""

    def __init__(self) -> None:
        self._client: Any = None
        self._app: Any = None

    def get(self, model: RolloutModel) -> Any:
        if self._client is None:
            import openai

            from services.rollout.standin import create_standin_app

            key = secrets.token_urlsafe(24)
            self._app = create_standin_app(key)
            transport = httpx.ASGITransport(app=self._app)
            # openai >= 3 is typed against its httpx fork but takes an httpx client (checked by the tests)
            http = httpx.AsyncClient(transport=transport, trust_env=False)
            self._client = openai.AsyncOpenAI(api_key=key, base_url="http://standin.internal/v1", max_retries=0,
                                              http_client=http)  # type: ignore[arg-type]
        # The model's script (kit/config.py) is the stand-in's own configuration, keyed by the name
        # LiteLLM sends it (litellm_model without ``openai/``); set per call, as this backend serves
        # both the rollout and the agent catalogues.
        self._app.state.scripts[model.litellm_model.removeprefix("openai/")] = model.script or []
        return self._client


class LiteLLMBackend:
    def __init__(self, config: RolloutConfig, secrets: ProviderSecrets):
        self.config = config
        self.secrets = secrets
        self._standin = _StandinClient()

    def _kwargs(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": model.litellm_model,
            "messages": request.message_dicts(),
            "max_tokens": max_tokens,
            "timeout": self.config.request_timeout_s,
            # One metered call is one attempt: a retry would bill usage the gym never sees
            # (LiteLLM's own retries and the OpenAI SDK's default 2 alike).
            "num_retries": 0,
            "max_retries": 0,
            **request.sampling_params(),
        }
        if model.served_by == "standin":
            kwargs["client"] = self._standin.get(model)
            return kwargs
        if model.api_base:
            kwargs["api_base"] = model.api_base
        secret = provider_key(self.secrets, model)
        if secret:
            kwargs["api_key"] = secret
        return kwargs

    async def complete(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        kwargs = self._kwargs(model, request, max_tokens)
        try:
            response = await _litellm().acompletion(**kwargs)
        except Exception as err:  # noqa: BLE001 - litellm raises many types; each maps to a gym error
            raise map_provider_error(err, model) from None
        return response.model_dump()

    async def stream(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        kwargs = self._kwargs(model, request, max_tokens)
        kwargs.update(stream=True, stream_options={"include_usage": True})
        try:
            upstream = await _litellm().acompletion(**kwargs)
        except Exception as err:  # noqa: BLE001 - litellm raises many types; each maps to a gym error
            raise map_provider_error(err, model) from None
        return self._chunks(upstream, model)

    @staticmethod
    async def _chunks(upstream: Any, model: RolloutModel) -> AsyncIterator[dict[str, Any]]:
        try:
            async for chunk in upstream:
                yield chunk.model_dump(exclude_none=True)
        except GymError:
            raise
        except Exception as err:  # noqa: BLE001 - litellm raises many types; each maps to a gym error
            raise map_provider_error(err, model) from None
