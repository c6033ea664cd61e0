"""One chat completion at a catalogue model, for another service's own calls (the audits'
LLM judge): rollout's LiteLLM backend with extra LiteLLM arguments passed through (tests use
LiteLLM's own ``mock_response``, so the real LiteLLM code path runs).

One call is one attempt, never a retry: the extra arguments cannot change that, nor the model,
messages or token cap. Nothing is reserved or metered here; the caller prices the answer from
the catalogue (services/rollout/metering.py).
"""

from __future__ import annotations

from typing import Any

from kit.config import RolloutConfig, RolloutModel
from kit.settings import ProviderSecrets
from services.rollout.backends.litellm_backend import LiteLLMBackend
from services.rollout.schemas import ChatRequest

_NEVER_OVERRIDDEN = ("num_retries", "max_retries", "model", "messages", "max_tokens", "stream")
"""Extra arguments may not change these: one call is one attempt at the catalogue model."""


class ProviderCall(LiteLLMBackend):
    """:meth:`complete` with ``extra`` LiteLLM arguments (those in ``_NEVER_OVERRIDDEN`` dropped)."""

    def __init__(self, config: RolloutConfig, secrets: ProviderSecrets, extra: dict[str, Any]):
        super().__init__(config, secrets)
        self.extra = {k: v for k, v in extra.items() if k not in _NEVER_OVERRIDDEN}

    def _kwargs(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        return {**super()._kwargs(model, request, max_tokens), **self.extra}
