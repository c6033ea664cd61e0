"""The Anthropic Messages API on top of the OpenAI-compatible rollout code, through LiteLLM's
own adapter (``litellm.llms.anthropic.messages.adapters``): a Messages request becomes a chat
completions request, and the answer (or its stream) becomes a Messages answer again.

The request schema here is what the gateway checks before any money is held. Real clients send
far more than the model needs (Claude Code 2.1.332: ``context_management``, ``output_config``,
adaptive ``thinking``, ``cache_control`` on blocks, ``defer_loading`` on tools, ``metadata``,
beta headers, a ``system`` turn inside ``messages``), so the rule is:

* **Forwarded** — what the chat form can carry: model, messages, system, client tools (name,
  description, input_schema), tool_choice, stop_sequences, temperature, top_p, max_tokens. A
  ``system`` message inside ``messages`` stays a system message at its place in the chat form
  (after the tool results it follows, as chat requires).
* **Dropped** — client housekeeping the chat form has no place for: thinking settings,
  ``context_management``, ``output_config``, ``metadata``, ``service_tier``, ``top_k``, cache
  control and ``defer_loading``, any per-message or per-tool key not listed above, and *every
  top-level field this schema does not declare* (the chat request is rebuilt from declared
  fields only, and re-serialized once more by services/rollout/schemas.py, so nothing undeclared
  can reach a provider; refusing would break each new client release). A declared field with a
  wrong-typed value is still a clear 422.
* **Refused** (403, before anything is reserved: the gateway's estimator parses the body first)
  — what would make a provider reach out on the agent's behalf: server tools (any tool that is
  not a client tool with an ``input_schema``: ``web_search_*``, ``web_fetch_*``,
  ``code_execution_*`` …), ``mcp_servers`` and ``container``.

``count_tokens`` takes the same bodies (``max_tokens`` and ``stream`` are dropped there, so a
client may count the very body it is about to send) but refuses sampling settings with 422, as
Anthropic's API does: they change nothing about a count and are the caller's mistake.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from kit.errors import PermissionDenied, Unprocessable, parsed_request
from services.rollout.schemas import ChatRequest

_CHAT_FIELDS = frozenset(ChatRequest.model_fields)
REACHING_OUT = {"mcp_servers": "MCP servers", "container": "a code-execution container"}
"""Top-level Messages fields that make the provider reach out on the agent's behalf (refused)."""
SAMPLING = ("temperature", "top_p", "top_k", "stop_sequences")
"""Generation settings, refused on ``count_tokens``."""


class AnthropicTool(BaseModel):
    """A client tool: the model asks for it, the client runs it. Housekeeping keys
    (``cache_control``, ``defer_loading``, ``strict`` …) are dropped."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant", "system"]
    """``system``: a mid-conversation system turn (Claude Code sends its environment so)."""
    content: str | list[dict[str, Any]]


class _Prompt(BaseModel):
    """What both a Messages and a ``count_tokens`` request hold (the prompt and its housekeeping)."""

    model_config = ConfigDict(extra="ignore")  # undeclared fields dropped: see the module docstring

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    # Declared to be type-checked, never forwarded:
    thinking: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class MessagesRequest(_Prompt):
    """An Anthropic Messages API request."""

    max_tokens: int = Field(gt=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, gt=0)
    service_tier: str | None = None


class CountTokensRequest(_Prompt):
    """An Anthropic ``/v1/messages/count_tokens`` request: what a Messages request would send
    the model, without the sampling settings (``client.messages.count_tokens``, Claude Code)."""


def _refuse_reaching_out(body: dict[str, Any]) -> None:
    for name, what in REACHING_OUT.items():
        if name in body:
            raise PermissionDenied(f"{name} is refused: the gym does not let providers use {what}", param=name)
    for i, tool in enumerate(body.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom") or not isinstance(tool, dict) or "input_schema" not in tool:
            raise PermissionDenied(f"tool type {kind!r} is refused: only client tools with an input_schema "
                                   "(a server tool would make the provider reach out)", param=f"tools.{i}.type")


def parse_messages_request(body: dict[str, Any]) -> MessagesRequest:
    return _parse(MessagesRequest, body)


def parse_count_tokens_request(body: dict[str, Any]) -> CountTokensRequest:
    for name in SAMPLING:
        if name in body:
            raise Unprocessable(f"unsupported field {name!r}: count_tokens counts the prompt, it samples nothing",
                                param=name)
    return _parse(CountTokensRequest, body)


def _parse[M: BaseModel](schema: type[M], body: dict[str, Any]) -> M:
    _refuse_reaching_out(body)
    return parsed_request(schema, body)


def _quiet_litellm() -> None:
    """As the rollout backend does: the adapter looks the gym's model names up as LiteLLM ids, and
    LiteLLM prints a "Provider List" banner on stdout for each miss unless told not to."""
    import litellm

    litellm.suppress_debug_info = True


def _adapter() -> Any:
    from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter

    _quiet_litellm()
    return AnthropicAdapter()


def _translate(request: _Prompt, generation: dict[str, Any]) -> dict[str, Any]:
    """The chat body of a parsed request, built from its forwarded fields only."""
    from litellm.llms.anthropic.messages.adapters.transformation import LiteLLMAnthropicMessagesAdapter
    from litellm.llms.anthropic.messages.native.mid_conversation_system import system_turns_after_tool_results
    from litellm.types.llms.anthropic import AnthropicMessagesRequest

    _quiet_litellm()
    messages = [m.model_dump() for m in request.messages]
    anthropic: dict[str, Any] = {
        "model": request.model,
        # A system turn right after tool_use goes after its tool results (chat requires the tool
        # messages to follow the call); kept as a chat system message, not turned into user text.
        "messages": list(system_turns_after_tool_results(messages)),
        **generation,
    }
    if request.system:
        anthropic["system"] = request.system
    if request.tools:
        anthropic["tools"] = [t.model_dump(exclude_none=True, exclude={"type"}) for t in request.tools]
    if request.tool_choice:
        anthropic["tool_choice"] = request.tool_choice
    try:
        translated, _ = LiteLLMAnthropicMessagesAdapter().translate_anthropic_to_openai(
            anthropic_message_request=cast(AnthropicMessagesRequest, anthropic), preserve_midturn_system=True)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise Unprocessable(f"the Messages request could not be translated: {err}") from None
    chat = {k: v for k, v in dict(translated or {}).items() if k in _CHAT_FIELDS}
    chat["model"] = request.model
    return json.loads(json.dumps(chat, default=str))  # plain JSON (the adapter returns typed dicts)


def to_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body a Messages request becomes (what the rollout code serves and the
    gateway's estimate bounds). Validated first; fields chat has no place for are dropped."""
    request = parse_messages_request(body)
    generation = request.model_dump(include={"stop_sequences", "temperature", "top_p"}, exclude_none=True)
    chat = _translate(request, generation)
    chat["max_tokens"] = request.max_tokens
    chat.pop("stream", None)
    return chat


def count_tokens_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body a ``count_tokens`` request's messages become (no ``max_tokens``:
    the prompt the model would be sent, translated exactly like a Messages request's)."""
    chat = _translate(parse_count_tokens_request(body), {})
    for name in ("max_tokens", "stream"):
        chat.pop(name, None)
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
