"""The agent route (``/agent/v1/…``) when the research agent's model is one of the gym's own: a
base model, or an ended run's accepted checkpoint (services/inference/agent_models.py), answered
by this service's own engines, every turn kept as the agent's trajectory
(services/records/agent_turns.py), like the rollout service does for provider models.

Why here and not through the rollout service's OpenAI-compatible pass-through: the gateway
already forwards the agent route with the run's agent-model meter as the payer
(gateway/agent_model.py, ``BilledRoute``); pointing that forward at this service for a gym model
keeps one reservation, settled on the exact token counts at the inference prices by the code
that counts them (``chat_cost``: a stream's trailer, or the service's own settlement when its
reader goes away), and needs no second, unmetered operator call from one service to another,
nor a price copied into a catalogue. The catch: only OpenAI chat completions are spoken for a
gym model (services/inference/agent_spec.py refuses the Messages and Responses dialects).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kit.config import GymConfig
from kit.http import ClosingStreamingResponse, json_object, sse_data, sse_events
from kit.identity import COST_HEADER, COST_TRAILER_PREFIX, Identity
from kit.service_app import CurrentIdentity
from services.inference.agent_models import GymAgentModel, resolve_agent_model, run_agent_model
from services.inference.agent_spec import PREFIX
from services.inference.service import InferenceService
from services.records import agent_turns

log = logging.getLogger("rsigym.inference.agent")


_summary = agent_turns.completion_summary


def _calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
             "arguments": (c.get("function") or {}).get("arguments")} for c in calls]


def _allowed(identity: Identity, name: str) -> bool:
    return all(p.allows_model(name) for p in identity.policies)


class AgentInference:
    """The agent route's gym models on the inference service's engines."""

    def __init__(self, config: GymConfig, inference: InferenceService):
        self.config, self.inference = config, inference

    def _resolver(self, identity: Identity) -> Any:
        def resolve(name: Any) -> tuple[Any, Any]:
            model: GymAgentModel = resolve_agent_model(self.config, self.inference.checkpoints, identity.run_id, name)
            return model.base, model.adapter

        return resolve

    def list_models(self, identity: Identity) -> list[dict[str, Any]]:
        """The configured agent models (provider, stand-in and gym-served) and the run's own gym
        model, when it was started with one."""
        data = [{"id": m.name, "object": "model", "owned_by": "rsigym-agent",
                 **({"served_by": "gym", "base_model": m.gym_model} if m.served_by == "gym" else {}),
                 "pricing": {"input_usd_per_mtok": m.input_usd_per_mtok, "output_usd_per_mtok": m.output_usd_per_mtok}}
                for m in self.config.agent_models if _allowed(identity, m.name)]
        chosen = run_agent_model(self.inference.checkpoints.store, identity.run_id)
        if chosen and chosen not in {m["id"] for m in data} and _allowed(identity, chosen):
            try:
                model = resolve_agent_model(self.config, self.inference.checkpoints, identity.run_id, chosen)
            except Exception as err:  # noqa: BLE001 - listed only while it can be served
                log.info("run %s: its agent model %s is not servable (%s)", identity.run_id, chosen, type(err).__name__)
            else:
                data.append({"id": chosen, "object": "model", "owned_by": "rsigym-agent", "served_by": "gym",
                             "base_model": model.base.name,
                             **({"checkpoint": model.adapter.key} if model.adapter is not None else {}),
                             "pricing": {"input_usd_per_mtok": model.base.prefill_usd_per_mtok,
                                         "output_usd_per_mtok": model.base.sample_usd_per_mtok}})
        return data

    async def _record(self, identity: Identity, request: dict[str, Any], response: dict[str, Any],
                      usage: dict[str, Any], cost_nusd: int, *, stream: bool) -> None:
        await agent_turns.record_served_turn(self.inference.checkpoints.store, identity, "openai", request, response,
                                             usage, cost_nusd, stream=stream)

    async def chat(self, identity: Identity, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        completion, cost = await self.inference.chat(identity, body, self._resolver(identity))
        await self._record(identity, body, _summary(completion), completion.get("usage") or {}, cost, stream=False)
        return completion, cost

    async def open_stream(self, identity: Identity, body: dict[str, Any]) -> AsyncIterator[bytes]:
        return self._tap(identity, body, await self.inference.open_stream(identity, body, self._resolver(identity)))

    async def _tap(self, identity: Identity, body: dict[str, Any], stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Relays the stream and keeps the turn it made: its text, tool calls, finish and usage
        (a stream cut short is kept at its reservation, the most it was billed)."""
        text: list[str] = []
        calls: list[dict[str, Any]] = []
        finish: str | None = None
        usage: dict[str, Any] = {}
        cost = identity.estimate_nusd
        try:
            async for piece in stream:
                for event in sse_events(piece):
                    if event.startswith(COST_TRAILER_PREFIX):
                        cost = int(event[len(COST_TRAILER_PREFIX):].strip() or b"0")
                        continue
                    data = sse_data(event)
                    if not isinstance(data, dict):
                        continue
                    usage = data.get("usage") or usage
                    for choice in data.get("choices") or []:
                        delta = choice.get("delta") or {}
                        if isinstance(delta.get("content"), str):
                            text.append(delta["content"])
                        calls.extend(delta.get("tool_calls") or [])
                        finish = choice.get("finish_reason") or finish
                yield piece
        finally:
            await self._record(identity, body, {"text": "".join(text), "tool_calls": _calls(calls),
                                                "finish_reason": finish}, usage, cost, stream=True)


router = APIRouter(prefix=PREFIX + "/v1")


def _service(request: Request) -> AgentInference:
    return request.app.state.agent


@router.get("/models")
async def list_models(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    service = _service(request)
    return {"object": "list", "data": await anyio.to_thread.run_sync(service.list_models, identity,
                                                                     limiter=service.inference.limiter)}


@router.post("/chat/completions")
async def chat_completions(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request, allows_nul=True)
    if body.get("stream") is True:
        return ClosingStreamingResponse(await _service(request).open_stream(identity, body),
                                        media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    completion, cost = await _service(request).chat(identity, body)
    return JSONResponse(completion, headers={COST_HEADER: str(cost)})
