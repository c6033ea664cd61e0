"""Rollout through LiteLLM: any OpenAI-compatible or native provider in the catalogue.

The provider key is read from the platform's environment at call time (``api_key_env``),
passed to LiteLLM for that one call and never returned, logged or stored. Provider errors
are mapped to gym errors with scrubbed messages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from services.core.config import RolloutConfig, RolloutModel
from services.core.errors import GymError, Unprocessable, UpstreamError, UpstreamRateLimited, UpstreamTimeout
from services.core.redact import redact
from services.core.settings import ProviderSecrets
from services.rollout.schemas import ChatRequest


def _litellm() -> Any:
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


def map_provider_error(err: Exception) -> GymError:
    status = getattr(err, "status_code", None)
    text = redact(str(err))[:400]
    name = type(err).__name__
    if "Timeout" in name:
        return UpstreamTimeout("the provider did not answer in time")
    if status in (400, 413, 422):
        return Unprocessable(f"the provider refused the request: {text}")
    if status == 429:
        return UpstreamRateLimited("the provider is rate limiting; retry later", headers={"Retry-After": "5"})
    if status in (401, 403):
        return UpstreamError("the provider refused the platform's credentials; tell the gym operator")
    return UpstreamError(f"the provider failed ({name}, status {status})")


class LiteLLMBackend:
    def __init__(self, config: RolloutConfig, secrets: ProviderSecrets):
        self.config = config
        self.secrets = secrets

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
        if model.api_base:
            kwargs["api_base"] = model.api_base
        secret = self.secrets.get(model.api_key_env)
        if secret:
            kwargs["api_key"] = secret
        return kwargs

    async def complete(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        try:
            response = await _litellm().acompletion(**self._kwargs(model, request, max_tokens))
        except Exception as err:  # noqa: BLE001 - litellm raises many types; each maps to a gym error
            raise map_provider_error(err) from None
        return response.model_dump()

    async def stream(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        kwargs = self._kwargs(model, request, max_tokens)
        kwargs.update(stream=True, stream_options={"include_usage": True})
        try:
            upstream = await _litellm().acompletion(**kwargs)
        except Exception as err:  # noqa: BLE001 - litellm raises many types; each maps to a gym error
            raise map_provider_error(err) from None
        return self._chunks(upstream)

    @staticmethod
    async def _chunks(upstream: Any) -> AsyncIterator[dict[str, Any]]:
        try:
            async for chunk in upstream:
                yield chunk.model_dump(exclude_none=True)
        except GymError:
            raise
        except Exception as err:  # noqa: BLE001 - litellm raises many types; each maps to a gym error
            raise map_provider_error(err) from None
