"""Request bodies of the inference service: OpenAI chat completions, as rollout spells them
(one chat schema for both OpenAI-compatible services), minus what local engines cannot do."""

from __future__ import annotations

from typing import Any

from services.core.errors import Unprocessable
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest, parse_chat_request

__all__ = ["CHAT_SYNONYMS", "UNSUPPORTED", "ChatRequest", "parse_inference_request"]

UNSUPPORTED = ("logit_bias", "logprobs", "top_logprobs", "response_format", "presence_penalty", "frequency_penalty")


def parse_inference_request(body: dict[str, Any]) -> ChatRequest:
    for name in UNSUPPORTED:
        if body.get(name) is not None:
            raise Unprocessable(f"{name} is not supported by gym inference", param=name)
    return parse_chat_request(body)
