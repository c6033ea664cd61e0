"""The Anthropic Messages API on top of the OpenAI-compatible rollout code, through LiteLLM's
own adapter (``litellm.llms.anthropic.messages.adapters``): a Messages request becomes a chat
completions request, and the answer (or its stream) becomes a Messages answer again.

The request schema here is what the gateway checks before any money is held; like the chat
schema (services/rollout/schemas.py) it refuses what would make a provider reach out on the
agent's behalf (server tools such as web search, MCP servers, containers). Extended-thinking
settings are accepted and not forwarded (the translated request keeps only chat fields).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.errors import PermissionDenied, Unprocessable
from services.rollout.schemas import ChatRequest

_CHAT_FIELDS = frozenset(ChatRequest.model_fields)


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="allow")  # cache_control and the like; dropped in translation
    type: str | None = None
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]


class MessagesRequest(BaseModel):
    """An Anthropic Messages API request (the fields the gym forwards)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(gt=0)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, gt=0)
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class CountTokensRequest(BaseModel):
    """An Anthropic ``/v1/messages/count_tokens`` request: what a Messages request would send
    the model, without the sampling settings (``client.messages.count_tokens``, Claude Code)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


def _refuse_fetching(body: dict[str, Any]) -> None:
    for name in ("mcp_servers", "container", "service_tier"):
        if name in body:
            raise PermissionDenied(f"{name} is refused: the gym does not let providers reach out", param=name)
    for i, tool in enumerate(body.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom") or not isinstance(tool, dict) or "input_schema" not in tool:
            raise PermissionDenied(f"tool type {kind!r} is refused: only client tools with an input_schema",
                                   param=f"tools.{i}.type")


def parse_messages_request(body: dict[str, Any]) -> MessagesRequest:
    return _parse(MessagesRequest, body)


def _parse[M: BaseModel](schema: type[M], body: dict[str, Any]) -> M:
    _refuse_fetching(body)
    try:
        return schema.model_validate(body)
    except ValidationError as err:  # one gym error with the first problem
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise Unprocessable(f"unsupported field {param!r}", param=param) from None
        raise Unprocessable(f"{param}: {first['msg']}", param=param) from None


def _adapter() -> Any:
    from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter

    return AnthropicAdapter()


def to_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body a Messages request becomes (what the rollout code serves and the
    gateway's estimate bounds). Validated first; fields chat has no place for are dropped."""
    request = parse_messages_request(body)
    kwargs = request.model_dump(exclude_none=True, exclude={"stream", "thinking", "top_k"})
    try:
        translated = _adapter().translate_completion_input_params(kwargs)
    except (ValueError, TypeError, KeyError) as err:
        raise Unprocessable(f"the Messages request could not be translated: {err}") from None
    chat = {k: v for k, v in dict(translated or {}).items() if k in _CHAT_FIELDS}
    chat["model"] = request.model
    chat["max_tokens"] = request.max_tokens
    chat.pop("stream", None)
    return json.loads(json.dumps(chat, default=str))  # plain JSON (the adapter returns typed dicts)


def count_tokens_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body a ``count_tokens`` request's messages become (no ``max_tokens``:
    the prompt the model would be sent, translated exactly like a Messages request's)."""
    request = _parse(CountTokensRequest, body)
    chat = to_chat_body({**request.model_dump(exclude_none=True), "max_tokens": 1})
    chat.pop("max_tokens", None)
    return chat


def to_messages_response(completion: dict[str, Any]) -> dict[str, Any]:
    """A rollout ``chat.completion`` as a Messages API answer."""
    from litellm.types.utils import ModelResponse

    usage = completion.get("usage") or {}
    response = ModelResponse(**{**completion, "usage": {k: usage[k] for k in ("prompt_tokens", "completion_tokens",
                                                                              "total_tokens") if k in usage}})
    message = _adapter().translate_completion_output_params(response)
    out = json.loads(json.dumps(message, default=str))
    out["model"] = completion.get("model")
    if "cost_usd" in usage:
        out.setdefault("usage", {})["cost_usd"] = usage["cost_usd"]
    return out


async def to_messages_stream(model: str, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Chat completion chunks (dicts) as the Messages API's SSE events."""
    from litellm.types.utils import ModelResponseStream

    async def typed() -> AsyncIterator[Any]:
        async for chunk in chunks:
            yield ModelResponseStream(**chunk)

    stream = _adapter().translate_completion_output_params_streaming(typed(), model=model)
    async for event in stream:
        yield event if isinstance(event, bytes) else str(event).encode()


def error_event(error: dict[str, Any]) -> bytes:
    """A Messages API ``error`` event (what a stream that broke off ends with)."""
    payload = {"type": "error", "error": {"type": error.get("type"), "message": error.get("message")}}
    return f"event: error\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()
