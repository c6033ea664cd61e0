"""Request bodies of the inference service: OpenAI chat completions, as rollout spells them
(one chat schema for both OpenAI-compatible services), minus what local engines cannot do."""

from __future__ import annotations

from typing import Any

from kit.errors import Unprocessable
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest, parse_chat_request

__all__ = ["CHAT_SYNONYMS", "UNSUPPORTED", "ChatRequest", "min_tokens_of", "parse_inference_request"]

UNSUPPORTED = ("logit_bias", "logprobs", "top_logprobs", "response_format", "presence_penalty", "frequency_penalty")
MAX_STOP = 4
"""Stop sequences per request (OpenAI's limit): every generated token is checked against each."""
MAX_STOP_CHARS = 64
"""The longest stop sequence, in characters."""


def parse_inference_request(body: dict[str, Any]) -> ChatRequest:
    for name in UNSUPPORTED:
        if body.get(name) is not None:
            raise Unprocessable(f"{name} is not supported by gym inference", param=name)
    request = parse_chat_request({k: v for k, v in body.items() if k != "min_tokens"})
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stop) > MAX_STOP:
        raise Unprocessable(f"stop may hold at most {MAX_STOP} sequences", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise Unprocessable(f"each stop sequence may be at most {MAX_STOP_CHARS} characters", param="stop")
    return request


def min_tokens_of(body: dict[str, Any], max_tokens: int) -> int:
    """``min_tokens`` (vLLM's sampling parameter, not OpenAI's): the end of the answer is not
    generated before this many tokens (stop sequences still apply). 0 when absent; a request's
    price is bounded by its ``max_tokens`` either way."""
    value = body.get("min_tokens")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= max_tokens:
        raise Unprocessable(f"min_tokens must be a whole number from 0 to max_tokens ({max_tokens})",
                            param="min_tokens")
    return value
