"""Rollout logic: frontier (catalogue) models for agents, metered token-exactly."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from services.core.config import GymConfig, RolloutModel
from services.core.errors import GymError, PermissionDenied
from services.core.identity import COST_TRAILER_PREFIX, Identity
from services.core.money import nusd_to_usd
from services.core.policy import ServicePolicy
from services.rollout.backends.base import RolloutBackend
from services.rollout.metering import (
    call_cost_nusd,
    catalogue_model,
    count_prompt_tokens,
    count_text_tokens,
    effective_max_tokens,
)
from services.rollout.schemas import ChatRequest, parse_chat_request

_CHOICE_KEYS = ("index", "message", "delta", "finish_reason", "logprobs")


def _allowed(identity: Identity, model: str) -> bool:
    return all(ServicePolicy.model_validate(p).allows_model(model) for p in identity.policies)


def _clean_choice(choice: dict[str, Any]) -> dict[str, Any]:
    out = {k: choice[k] for k in _CHOICE_KEYS if k in choice}
    for part in ("message", "delta"):
        if isinstance(out.get(part), dict):
            out[part] = {k: v for k, v in out[part].items() if v is not None and k != "provider_specific_fields"}
    return out


def _usage(prompt: int, completion: int, cost_nusd: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cost_usd": nusd_to_usd(cost_nusd),
    }


def sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class RolloutService:
    def __init__(self, config: GymConfig, backend: RolloutBackend):
        self.config = config
        self.backend = backend

    def list_models(self, identity: Identity) -> list[dict[str, Any]]:
        return [
            {
                "id": m.name,
                "object": "model",
                "owned_by": "rsigym-rollout",
                "pricing": {"input_usd_per_mtok": m.input_usd_per_mtok, "output_usd_per_mtok": m.output_usd_per_mtok},
            }
            for m in self.config.rollout.models
            if _allowed(identity, m.name)
        ]

    def _prepare(self, identity: Identity, body: dict[str, Any]) -> tuple[ChatRequest, RolloutModel, int]:
        request = parse_chat_request(body)
        if not _allowed(identity, request.model):
            raise PermissionDenied(f"model {request.model!r} is not in this key's rollout allowlist", param="model")
        model = catalogue_model(self.config.rollout, request.model)
        return request, model, effective_max_tokens(request, model, self.config.rollout)

    async def chat(self, identity: Identity, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Returns the OpenAI-shaped completion and its cost in nano-USD."""
        request, model, max_tokens = self._prepare(identity, body)
        raw = await self.backend.complete(model, request, max_tokens)
        usage = raw.get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or count_prompt_tokens(model, request))
        completion = int(usage.get("completion_tokens") or 0)
        cost = call_cost_nusd(model, prompt, completion)
        return {
            "id": raw.get("id"),
            "object": "chat.completion",
            "created": raw.get("created"),
            "model": model.name,
            "choices": [_clean_choice(c) for c in raw.get("choices") or []],
            "usage": _usage(prompt, completion, cost),
        }, cost

    async def open_stream(self, identity: Identity, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Opens the provider stream now (so refusals are plain errors) and returns SSE bytes.

        The stream ends with an SSE comment carrying the exact cost for the gateway to settle.
        """
        request, model, max_tokens = self._prepare(identity, body)
        chunks = await self.backend.stream(model, request, max_tokens)
        return self._relay(request, model, chunks)

    async def _relay(self, request: ChatRequest, model: RolloutModel, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        want_usage = bool(request.stream_options and request.stream_options.include_usage)
        usage: dict[str, Any] | None = None
        streamed: list[str] = []
        error: GymError | None = None
        try:
            async for chunk in chunks:
                if chunk.get("usage"):
                    usage = chunk["usage"]
                choices = [_clean_choice(c) for c in chunk.get("choices") or []]
                for choice in choices:
                    streamed.append(str((choice.get("delta") or {}).get("content") or ""))
                if choices:
                    yield sse({"id": chunk.get("id"), "object": "chat.completion.chunk", "created": chunk.get("created"),
                               "model": model.name, "choices": choices})
        except GymError as err:
            error = err
        if usage:
            prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        else:  # the provider sent no usage (or broke off): count what was actually streamed
            prompt, completion = count_prompt_tokens(model, request), count_text_tokens(model, "".join(streamed))
        cost = call_cost_nusd(model, prompt, completion)
        if error is not None:
            yield sse({"error": {"type": error.type, "message": error.message, "param": error.param}})
        elif want_usage:
            yield sse({"object": "chat.completion.chunk", "model": model.name, "choices": [],
                       "usage": _usage(prompt, completion, cost)})
        yield COST_TRAILER_PREFIX + str(cost).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
