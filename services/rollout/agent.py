"""The research agent's own model (``/agent/v1/…`` on the gateway): the rollout service's code
serving a different catalogue (``agent_models`` in the gym config), in three dialects — OpenAI
chat completions, the OpenAI Responses API (services/rollout/responses.py) and the Anthropic
Messages API (services/rollout/anthropic.py) — with every turn kept as the agent's trajectory
(services/records/agent_turns.py).

Metering is the rollout service's own, unchanged: the gateway reserves the worst case on the
run's agent-model meter (gateway/agent_model.py), this code reports the provider's exact usage
at catalogue prices (a header, or the stream's cost trailer) and the gateway settles it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kit.config import GymConfig
from kit.errors import PermissionDenied
from kit.http import json_object, sse_data, sse_events
from kit.identity import COST_HEADER, COST_TRAILER_PREFIX, Identity
from kit.service_app import CurrentIdentity
from services.records import agent_turns
from services.rollout import anthropic, responses
from services.rollout.agent_spec import PREFIX, count_messages_tokens
from services.rollout.backends.base import RolloutBackend
from services.rollout.service import RolloutService
from storage.store import Store

log = logging.getLogger("rsigym.rollout.agent")

"""Where the rollout app serves the agent routes (the gateway's ``agent`` spec forwards here)."""


class _Assembled:
    """What a stream said, put back together: text, tool calls, finish reason, usage."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.error: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(int(call.get("index", 0)), {"id": None, "name": None, "arguments": ""})
                fn = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] = fn.get("name") or slot["name"]
                slot["arguments"] += fn.get("arguments") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def response(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": "".join(self.text), "tool_calls": [self.tool_calls[i] for i in sorted(self.tool_calls)],
                               "finish_reason": self.finish_reason}
        if self.error is not None:
            out["error"] = self.error
        return out


_summary = agent_turns.completion_summary


class AgentModelService:
    def __init__(self, config: GymConfig, backend: RolloutBackend, store: Store):
        self.rollout = RolloutService(config.model_copy(update={"rollout": config.agent_catalogue()}), backend)
        self.store = store

    def list_models(self, identity: Identity) -> list[dict[str, Any]]:
        return [{**m, "owned_by": "rsigym-agent"} for m in self.rollout.list_models(identity)]

    async def _record(self, identity: Identity, api: agent_turns.Api, request: dict[str, Any], response: dict[str, Any],
                      usage: dict[str, Any], cost_nusd: int, *, stream: bool) -> None:
        await agent_turns.record_served_turn(self.store, identity, api, request, response, usage, cost_nusd,
                                             stream=stream)

    # -- OpenAI chat completions ---------------------------------------------------------

    async def chat(self, identity: Identity, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        completion, cost = await self.rollout.chat(identity, body)
        await self._record(identity, "openai", body, _summary(completion), completion.get("usage") or {}, cost,
                           stream=False)
        return completion, cost

    async def open_stream(self, identity: Identity, body: dict[str, Any]) -> AsyncIterator[bytes]:
        return self._tap(identity, body, await self.rollout.open_stream(identity, body))

    async def _tap(self, identity: Identity, body: dict[str, Any], stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        seen, cost = _Assembled(), identity.estimate_nusd
        try:
            async for piece in stream:
                for event in sse_events(piece):
                    if event.startswith(COST_TRAILER_PREFIX):
                        cost = int(event[len(COST_TRAILER_PREFIX):].strip() or b"0")
                        continue
                    data = sse_data(event)
                    if isinstance(data, dict):
                        seen.error = data.get("error") or seen.error
                        seen.feed(data)
                yield piece
        finally:
            await self._record(identity, "openai", body, seen.response(), seen.usage, cost, stream=True)

    # -- Anthropic Messages --------------------------------------------------------------

    async def messages(self, identity: Identity, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        completion, cost = await self.rollout.chat(identity, anthropic.to_chat_body(body))
        await self._record(identity, "anthropic", body, _summary(completion), completion.get("usage") or {}, cost,
                           stream=False)
        return anthropic.to_messages_response(completion), cost

    async def count_tokens(self, identity: Identity, body: dict[str, Any]) -> dict[str, int]:
        """``/v1/messages/count_tokens``: free, no provider call, no trajectory turn."""
        model = body.get("model")
        if not all(p.allows_model(model) for p in identity.policies):
            raise PermissionDenied(f"model {model!r} is not in this key's agent model allowlist", param="model")
        tokens = await anyio.to_thread.run_sync(count_messages_tokens, body, self.rollout.config.rollout)
        return {"input_tokens": tokens}

    async def open_messages_stream(self, identity: Identity, body: dict[str, Any]) -> AsyncIterator[bytes]:
        chat = {**anthropic.to_chat_body(body), "stream": True, "stream_options": {"include_usage": True}}
        return self._messages_stream(identity, body, await self.rollout.open_stream(identity, chat))

    async def _messages_stream(self, identity: Identity, body: dict[str, Any],
                               stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        seen, trailer = _Assembled(), b""

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            nonlocal trailer
            async for piece in stream:
                for event in sse_events(piece):
                    if event.startswith(COST_TRAILER_PREFIX):
                        trailer = event + b"\n\n"
                        continue
                    data = sse_data(event)
                    if not isinstance(data, dict):
                        continue
                    if data.get("error"):
                        seen.error = data["error"]
                        continue
                    seen.feed(data)
                    yield {**data, "usage": agent_turns.usage_tokens(data["usage"])} if data.get("usage") else data

        try:
            async for event in anthropic.to_messages_stream(str(body.get("model")), chunks()):
                yield event
            if seen.error is not None:
                yield anthropic.error_event(seen.error)
            yield trailer
        finally:
            cost = int(trailer[len(COST_TRAILER_PREFIX):].strip() or b"0") if trailer else identity.estimate_nusd
            await self._record(identity, "anthropic", body, seen.response(), seen.usage, cost, stream=True)


    # -- OpenAI Responses ---------------------------------------------------------------

    async def responses(self, identity: Identity, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        completion, cost = await self.rollout.chat(identity, responses.to_chat_body(body))
        await self._record(identity, "responses", body, _summary(completion), completion.get("usage") or {}, cost,
                           stream=False)
        return responses.to_response(completion, body), cost

    async def open_responses_stream(self, identity: Identity, body: dict[str, Any]) -> AsyncIterator[bytes]:
        stream = await self.rollout.open_stream(identity, responses.stream_chat_body(body))
        return self._responses_stream(identity, body, stream)

    async def _responses_stream(self, identity: Identity, body: dict[str, Any],
                                stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        seen = _Assembled()
        translated = responses.ResponsesStream(body, stream, on_chunk=seen.feed)
        try:
            async for event in translated.events():
                yield event
        finally:
            seen.error = translated.error
            trailer = translated.trailer
            cost = int(trailer[len(COST_TRAILER_PREFIX):].strip() or b"0") if trailer else identity.estimate_nusd
            await self._record(identity, "responses", body, seen.response(), seen.usage, cost, stream=True)


router = APIRouter(prefix=PREFIX + "/v1")


def _service(request: Request) -> AgentModelService:
    return request.app.state.agent


def _sse(stream: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/models")
async def list_models(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return {"object": "list", "data": _service(request).list_models(identity)}


@router.post("/chat/completions")
async def chat_completions(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request, allows_nul=True)
    if body.get("stream") is True:
        return _sse(await _service(request).open_stream(identity, body))
    completion, cost = await _service(request).chat(identity, body)
    return JSONResponse(completion, headers={COST_HEADER: str(cost)})


@router.post("/messages/count_tokens")
async def count_tokens(request: Request, identity: CurrentIdentity) -> dict[str, int]:
    return await _service(request).count_tokens(identity, await json_object(request, allows_nul=True))


@router.post("/messages")
async def messages(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request, allows_nul=True)
    if body.get("stream") is True:
        return _sse(await _service(request).open_messages_stream(identity, body))
    message, cost = await _service(request).messages(identity, body)
    return JSONResponse(message, headers={COST_HEADER: str(cost)})


@router.post("/responses")
async def create_response(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request, allows_nul=True)
    if body.get("stream") is True:
        return _sse(await _service(request).open_responses_stream(identity, body))
    response, cost = await _service(request).responses(identity, body)
    return JSONResponse(response, headers={COST_HEADER: str(cost)})
