"""Prices of rollout calls: the reservation before, the settlement after.

The reservation must be a true *upper bound* of what the provider can bill, because the
ledger never charges more than it held: whatever the estimate misses is provider spend no
budget paid for (it is still recorded as an overrun, see billing/ledger.py). So the
prompt is not *counted* with a tokenizer — ``litellm.token_counter`` is an estimate of one
tokenizer, and the provider's may differ — it is *bounded*:

* Every token of a byte-level BPE (GPT, Claude, Llama 3, Qwen …) covers at least one byte,
  and a byte-fallback SentencePiece (Llama 2, Gemma, Gemini …) piece covers at least one
  character or one byte; so a text never has more tokens than UTF-8 bytes.
* The text is everything forwarded to the provider (services/rollout/backends/litellm_backend.py
  sends the messages and :meth:`ChatRequest.sampling_params`): messages as JSON (content
  parts, names, tool calls), and the tools, tool_choice, response_format schema, stop
  sequences … as JSON. JSON only adds bytes to the text it carries (quotes, escapes, keys),
  and is longer than the forms providers render tools and schemas into.
* On top come what the provider adds around that text: framing special tokens per message,
  per tool, per request, and the instructions providers inject for tool use and structured
  output (Anthropic documents up to 346 tokens for its tool-use system prompt).
* Inline images are not counted by their base64 size (a photo would reserve ~10⁶ tokens):
  each is bounded by the model's ``max_image_tokens`` (kit/config.py). Inline
  audio and files count their base64 bytes (audio bills far fewer tokens than its bytes);
  a file also gets one image's worth, as providers render PDF pages as images.
* Each of the ``n`` choices is bounded as a full call (prompt + ``max_tokens``): providers
  bill the prompt once, but the bound must hold for any provider. LiteLLM never retries on
  its own (``num_retries`` is 0), so one call is one attempt.

The settled cost is the provider's reported usage at catalogue prices, *not* clamped here:
the gateway charges at most the reservation and records any excess as an overrun.
Prices are computed in integer nano-USD from the catalogue rather than through LiteLLM's
global price map, so the same numbers appear in the estimate, the ledger and docs.
"""

from __future__ import annotations

import json
from typing import Any

from billing.money import token_cost_nusd
from kit.config import RolloutConfig, RolloutModel
from kit.errors import NotFound, Unprocessable
from kit.spec import ServiceContext
from services.rollout.schemas import ChatRequest, parse_chat_request

REQUEST_OVERHEAD_TOKENS = 32
"""BOS, reply priming and template text around the conversation (Llama 3.1's default system
header with its dates is ~25 tokens)."""
MESSAGE_OVERHEAD_TOKENS = 8
"""Role headers and separators per message (OpenAI: 3-4 tokens, Llama 3: 5, Llama 2: ~10),
on top of the message's JSON keys, which already count ~28 bytes."""
TOOL_OVERHEAD_TOKENS = 32
"""The frame a tool is rendered into, e.g. ``type name = (_: {...}) => any;``."""
STRUCTURED_OVERHEAD_TOKENS = 512
"""Instructions a provider injects once when tools or a JSON response format are present."""


def catalogue_model(config: RolloutConfig, name: str) -> RolloutModel:
    model = config.model(name)
    if model is None:
        raise NotFound(f"model {name!r} is not in the rollout catalogue", param="model")
    return model


def max_tokens_cap(model: RolloutModel, config: RolloutConfig) -> int:
    """The most ``max_tokens`` a call to ``model`` may ask for: the model's own
    ``max_output_tokens`` when it declares one (above or below the catalogue's cap: a model that
    writes 64000 tokens is asked for them by Claude Code), else the catalogue-wide
    ``max_tokens_cap``. The reservation covers whatever is asked (``max_tokens`` × output price)."""
    return model.max_output_tokens or config.max_tokens_cap


def effective_max_tokens(request: ChatRequest, model: RolloutModel, config: RolloutConfig) -> int:
    cap = max_tokens_cap(model, config)
    asked = request.requested_max_tokens()
    if asked is not None and asked > cap:
        whose = "its max_output_tokens" if model.max_output_tokens else "the catalogue's max_tokens_cap"
        raise Unprocessable(f"max_tokens may be at most {cap} for {model.name} ({whose})", param="max_tokens")
    return asked or min(config.default_max_tokens, cap)


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _part_bound(model: RolloutModel, part: Any) -> tuple[Any, int]:
    """A content part with inline images taken out, and the tokens bounding what was taken."""
    if isinstance(part, dict) and part.get("type") == "image_url":
        image = part.get("image_url")
        rest = {k: v for k, v in image.items() if k != "url"} if isinstance(image, dict) else {}
        return {"type": "image_url", "image_url": rest}, model.max_image_tokens
    if isinstance(part, dict) and part.get("type") == "file":
        return part, model.max_image_tokens
    return part, 0


def prompt_bound_tokens(model: RolloutModel, request: ChatRequest) -> int:
    """An upper bound of the input tokens any provider can bill for one choice of ``request``."""
    tokens = REQUEST_OVERHEAD_TOKENS
    for message in request.message_dicts():
        content = message.get("content")
        if isinstance(content, list):
            parts = [_part_bound(model, part) for part in content]
            message = {**message, "content": [part for part, _ in parts]}
            tokens += sum(extra for _, extra in parts)
        tokens += MESSAGE_OVERHEAD_TOKENS + _json_bytes(message)
    params = request.sampling_params()
    tokens += _json_bytes(params)
    tokens += TOOL_OVERHEAD_TOKENS * len(request.tools or [])
    fmt_type = (request.response_format or {}).get("type")
    if request.tools or fmt_type in ("json_object", "json_schema"):
        tokens += STRUCTURED_OVERHEAD_TOKENS
    return tokens


def call_cost_nusd(model: RolloutModel, prompt_tokens: int, completion_tokens: int) -> int:
    return token_cost_nusd(prompt_tokens, model.input_usd_per_mtok) + token_cost_nusd(
        completion_tokens, model.output_usd_per_mtok
    )


def reservation_nusd(model: RolloutModel, request: ChatRequest, max_tokens: int) -> int:
    """The most one call can cost: every one of the ``n`` choices billed as a full call."""
    return request.n * call_cost_nusd(model, prompt_bound_tokens(model, request), max_tokens)


def estimate_chat_tokens(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    """Gateway hook: worst-case tokens of one chat completion (what a token-rate limit counts)."""
    config = context.config
    request = parse_chat_request(body)
    model = catalogue_model(config.rollout, request.model)
    return request.n * (prompt_bound_tokens(model, request) + effective_max_tokens(request, model, config.rollout))


def estimate_chat(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    """Gateway hook: worst-case cost of one chat completion."""
    config = context.config
    request = parse_chat_request(body)
    model = catalogue_model(config.rollout, request.model)
    return reservation_nusd(model, request, effective_max_tokens(request, model, config.rollout))
