"""The OpenAI Responses API (``POST /v1/responses``) on top of the chat completions the rollout
code serves and meters, through LiteLLM's own bridge
(``litellm.responses.litellm_completion_transformation``): a Responses request becomes a chat
completions request, and the answer (or its stream) becomes a Responses answer again — what the
unmodified ``openai`` SDK's ``client.responses`` and the Codex CLI (``wire_api = "responses"``)
speak.

The gym keeps no provider-side state, so what would need it is refused: ``store: true`` (403, as
chat refuses it), ``previous_response_id``, ``conversation``, ``background`` and ``item_reference``
inputs (422). Server tools (web search, file search, code interpreter, computer use, image
generation, MCP, …) would make the provider reach out on the agent's behalf: 403 before any money
is held. Client tools pass: ``function``, ``custom`` (LiteLLM turns it into a function) and
``namespace`` (a group of functions, flattened by LiteLLM to ``<namespace>__<name>`` and given
back as a ``function_call`` with its ``namespace`` — what Codex sends and expects).

Hand-written here, because LiteLLM's bridge has no place for them: the refusals above; dropping
``reasoning`` input items (chat providers take no replayed reasoning) and the housekeeping fields
(``include``, ``prompt_cache_key``, ``client_metadata``, ``metadata``, ``service_tier``,
``truncation``, ``reasoning``); the gym's cost on ``usage.cost_usd`` and its cost trailer; and a
``response.failed`` event for a provider stream that broke off.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kit.errors import GymError, PermissionDenied, Unprocessable, parsed_request
from kit.http import sse_data, sse_events
from services.rollout.schemas import ChatRequest

log = logging.getLogger("rsigym.rollout.responses")

_CHAT_FIELDS = frozenset(ChatRequest.model_fields)
CLIENT_TOOLS = frozenset({"function", "custom", "namespace"})
"""Tools the client runs itself; every other tool type is the provider's (a server tool)."""
STATEFUL = {"previous_response_id": "an earlier stored response", "conversation": "a stored conversation",
            "background": "a stored background response", "prompt": "a stored prompt template"}
"""Fields that need provider-side state: refused (422) when set, the gym stores nothing there."""
HOUSEKEEPING = ("include", "prompt_cache_key", "client_metadata", "metadata", "service_tier", "truncation",
                "reasoning", "store", "stream_options", "safety_identifier", "prompt_cache_retention")
"""Accepted and not forwarded: they change nothing the chat provider could do for this call."""


RESPONSES_SYNONYMS = {"max_output_tokens": "max_tokens"}
"""The Responses API names the output cap ``max_output_tokens``; the gateway rewrites it to the
chat's ``max_tokens`` (kit/canonical.py) before policies apply, so one rule bounds every dialect."""


class ResponsesRequest(BaseModel):
    """An OpenAI Responses API request (the fields the gym accepts; what it forwards is the chat
    request it becomes, :func:`to_chat_body`)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    """The gym's spelling of ``max_output_tokens`` (:data:`RESPONSES_SYNONYMS`): the gateway writes
    the cap so before any policy looks, so a rule on ``max_tokens`` binds Responses calls as chat ones."""
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    user: str | None = None
    # Housekeeping: accepted, never forwarded.
    reasoning: dict[str, Any] | None = None
    store: bool | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    client_metadata: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    truncation: str | None = None
    # Refused when set (no provider-side state); declared so that null/false pass.
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    prompt: dict[str, Any] | None = None


def _refuse(body: dict[str, Any]) -> None:
    """403 for what would make the provider store or reach out; 422 for what needs stored state."""
    if body.get("store") is True:
        raise PermissionDenied("store: true is refused: the gym does not let providers store responses "
                               "(send store: false)", param="store")
    for name, what in STATEFUL.items():
        if body.get(name) not in (None, False):
            raise Unprocessable(f"{name} is not supported: the gym keeps no provider-side state, so it cannot use "
                                f"{what}; send the whole conversation as input", param=name)
    for i, tool in enumerate(body.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind not in CLIENT_TOOLS:
            raise PermissionDenied(f"tool type {kind!r} is refused: the gym does not let providers run tools "
                                   "(only function, custom and namespace tools)", param=f"tools.{i}.type")
        if kind == "namespace":
            for j, inner in enumerate(tool.get("tools") or []):
                inner_kind = inner.get("type") if isinstance(inner, dict) else type(inner).__name__
                if inner_kind not in ("function", "custom"):
                    raise PermissionDenied(f"tool type {inner_kind!r} is refused in a namespace: only function and "
                                           "custom tools", param=f"tools.{i}.tools.{j}.type")
    items = body.get("input")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            raise Unprocessable("item_reference inputs are not supported: the gym keeps no provider-side state; "
                                "send the item itself", param=f"input.{i}")


def parse_responses_request(body: dict[str, Any]) -> ResponsesRequest:
    _refuse(body)
    return parsed_request(ResponsesRequest, body)


def _bridge() -> Any:
    import litellm
    from litellm.responses.litellm_completion_transformation.transformation import LiteLLMCompletionResponsesConfig

    litellm.suppress_debug_info = True  # as the rollout backend sets it: no "Provider List" banners on stdout
    return LiteLLMCompletionResponsesConfig


def _optional_params(request: ResponsesRequest) -> dict[str, Any]:
    """What LiteLLM's bridge reads besides the input (and echoes back on the response)."""
    params = request.model_dump(exclude_none=True, exclude={"model", "input", "stream", "max_tokens", *HOUSEKEEPING,
                                                            *STATEFUL})
    if request.max_tokens is not None:
        params["max_output_tokens"] = request.max_tokens
    return params


def _input(request: ResponsesRequest) -> str | list[dict[str, Any]]:
    """The input without ``reasoning`` items: a chat provider takes no replayed reasoning."""
    if isinstance(request.input, str):
        return request.input
    return [item for item in request.input if not (isinstance(item, dict) and item.get("type") == "reasoning")]


def to_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body a Responses request becomes: what the rollout code serves and the
    gateway's estimate bounds. Validated first; ``max_output_tokens`` is the chat's ``max_tokens``
    (bounded like any chat's); fields chat has no place for are dropped."""
    request = parse_responses_request(body)
    try:
        translated = _bridge().transform_responses_api_request_to_chat_completion_request(
            model=request.model, input=_input(request), responses_api_request=_optional_params(request),
            custom_llm_provider="openai")
    except (ValueError, TypeError, KeyError) as err:
        raise Unprocessable(f"the Responses request could not be translated: {err}") from None
    chat = {k: v for k, v in dict(translated or {}).items() if k in _CHAT_FIELDS}
    chat.pop("stream", None)
    chat.pop("stream_options", None)
    chat["model"] = request.model
    if (cap := request.max_tokens or request.max_output_tokens) is not None:
        chat["max_tokens"] = cap
    if not chat.get("messages"):
        raise Unprocessable("input holds no message for the model", param="input")
    return json.loads(json.dumps(chat, default=str))  # plain JSON (the bridge returns typed dicts)


def stream_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """:func:`to_chat_body`, streamed with the usage the Responses ``response.completed`` carries."""
    return {**to_chat_body(body), "stream": True, "stream_options": {"include_usage": True}}


def _tokens(usage: dict[str, Any]) -> dict[str, Any]:
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens") if k in usage}


def to_response(completion: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A rollout ``chat.completion`` as a Responses API ``response`` object (with the gym's cost on
    ``usage.cost_usd``, as chat's usage carries it)."""
    from litellm.types.utils import ModelResponse

    request = parse_responses_request(body)
    usage = completion.get("usage") or {}
    response = _bridge().transform_chat_completion_response_to_responses_api_response(
        request_input=_input(request), responses_api_request=_optional_params(request),
        chat_completion_response=ModelResponse(**{**completion, "usage": _tokens(usage)}))
    out = json.loads(response.model_dump_json(exclude_none=True))
    out["model"] = completion.get("model")
    if "cost_usd" in usage:
        out.setdefault("usage", {})["cost_usd"] = usage["cost_usd"]
    return out


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class _BrokeOff(Exception):  # noqa: N818 - a signal out of LiteLLM's iterator, not an error of its own
    pass


class _Chunks:
    """The rollout's chat SSE as LiteLLM's bridge reads a LiteLLM stream (``__anext__`` of typed
    chunks, ``logging_obj``, ``aclose``), keeping aside the cost trailer and the final usage."""

    logging_obj = None

    def __init__(self, stream: AsyncIterator[bytes], on_chunk: Callable[[dict[str, Any]], None] | None):
        self.stream, self.on_chunk = stream, on_chunk
        self.trailer = b""
        self.error: dict[str, Any] | None = None
        self.cost_usd: float | None = None
        self._chunks = self._read()

    async def _read(self) -> AsyncGenerator[Any]:
        from litellm.types.utils import ModelResponseStream

        from kit.identity import COST_TRAILER_PREFIX  # here: kit.identity's imports reach the specs, which import this

        async for piece in self.stream:
            for event in sse_events(piece):
                if event.startswith(COST_TRAILER_PREFIX):
                    self.trailer = event + b"\n\n"
                    continue
                data = sse_data(event)
                if not isinstance(data, dict):
                    continue
                if data.get("error"):
                    self.error = data["error"]
                    continue
                if self.on_chunk is not None:
                    self.on_chunk(data)
                if data.get("usage"):
                    self.cost_usd = data["usage"].get("cost_usd", self.cost_usd)
                    data = {**data, "usage": _tokens(data["usage"])}
                yield ModelResponseStream(**data)
        if self.error is not None:
            raise _BrokeOff

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> Any:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        await self._chunks.aclose()


class ResponsesStream:
    """A rollout chat stream as the Responses API's SSE events (``event:`` lines, sequence
    numbers, ``response.completed`` with usage and the gym's cost). The cost trailer the gateway
    settles on goes out just before the terminal event, so the charge is settled by the time a
    client that stops reading at ``response.completed`` has it; a stream that broke off ends with
    ``response.failed`` (then the trailer)."""

    def __init__(self, body: dict[str, Any], stream: AsyncIterator[bytes],
                 on_chunk: Callable[[dict[str, Any]], None] | None = None):
        self.request = parse_responses_request(body)
        self.chunks = _Chunks(stream, on_chunk)

    @property
    def trailer(self) -> bytes:
        return self.chunks.trailer

    @property
    def error(self) -> dict[str, Any] | None:
        return self.chunks.error

    async def events(self) -> AsyncIterator[bytes]:
        from litellm.responses.litellm_completion_transformation.streaming_iterator import (
            LiteLLMCompletionStreamingIterator,
        )

        _bridge()
        bridge = LiteLLMCompletionStreamingIterator(
            model=self.request.model, litellm_custom_stream_wrapper=self.chunks,  # type: ignore[arg-type]
            request_input=_input(self.request), responses_api_request=_optional_params(self.request),  # type: ignore[arg-type]
            custom_llm_provider="openai")
        sequence, response_id, settled = 0, None, False
        try:
            async for typed in bridge:
                event = json.loads(typed.model_dump_json(exclude_none=True))
                sequence = int(event.get("sequence_number", sequence)) + 1
                response = event.get("response")
                if isinstance(response, dict):
                    response_id = response.get("id", response_id)
                    response["model"] = self.request.model
                if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                    if isinstance(response, dict) and self.chunks.cost_usd is not None:
                        response.setdefault("usage", {})["cost_usd"] = self.chunks.cost_usd
                    settled = True
                    yield self.trailer
                yield _sse(event)
        except _BrokeOff:
            yield self._failed(sequence, response_id, self.error or {})
            yield self.trailer
        except GymError:
            raise
        except Exception as err:  # noqa: BLE001 - a bug in translation must still end the stream, billed
            log.exception("the Responses stream could not be translated")
            try:
                async for _ in self.chunks:  # read on to the cost trailer: the call is settled exactly
                    pass
            except _BrokeOff:
                pass
            yield self._failed(sequence, response_id, {"type": "internal_error",
                                                       "message": f"the gym could not translate the stream: {err}"})
            if not settled:
                yield self.trailer

    def _failed(self, sequence: int, response_id: str | None, error: dict[str, Any]) -> bytes:
        code = str(error.get("type") or "upstream_error")
        return _sse({"type": "response.failed", "sequence_number": sequence, "response": {
            "id": response_id or "resp_failed", "object": "response", "status": "failed",
            "model": self.request.model, "output": [],
            "error": {"code": code, "message": str(error.get("message") or "the provider stream broke off")}}})
