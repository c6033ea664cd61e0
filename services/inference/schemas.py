"""Request bodies of the inference service: OpenAI chat completions, as rollout spells them
(one chat schema for both OpenAI-compatible services), minus what local engines cannot do."""

from __future__ import annotations

from typing import Any

from services.core.errors import Unprocessable
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest, parse_chat_request

__all__ = ["CHAT_SYNONYMS", "UNSUPPORTED", "ChatRequest", "parse_inference_request"]

UNSUPPORTED = ("logit_bias", "logprobs", "top_logprobs", "response_format", "presence_penalty", "frequency_penalty")
MAX_STOP = 4
"""Stop sequences per request (OpenAI's limit): every generated token is checked against each."""
MAX_STOP_CHARS = 64
"""The longest stop sequence, in characters."""


def parse_inference_request(body: dict[str, Any]) -> ChatRequest:
    for name in UNSUPPORTED:
        if body.get(name) is not None:
            raise Unprocessable(f"{name} is not supported by gym inference", param=name)
    request = parse_chat_request(body)
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stop) > MAX_STOP:
        raise Unprocessable(f"stop may hold at most {MAX_STOP} sequences", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise Unprocessable(f"each stop sequence may be at most {MAX_STOP_CHARS} characters", param="stop")
    return request
