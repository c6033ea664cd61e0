"""Routes of the rollout service (OpenAI-compatible: chat completions and the Responses API).
Thin: logic lives in service.py and responses.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kit.http import json_object
from kit.identity import COST_HEADER
from kit.service_app import CurrentIdentity
from services.rollout import responses
from services.rollout.service import RolloutService

router = APIRouter(prefix="/v1")


def _service(request: Request) -> RolloutService:
    return request.app.state.rollout


@router.get("/models")
async def list_models(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return {"object": "list", "data": _service(request).list_models(identity)}


@router.post("/chat/completions")
async def chat_completions(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request, allows_nul=True)
    service = _service(request)
    if body.get("stream") is True:
        stream = await service.open_stream(identity, body)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    completion, cost = await service.chat(identity, body)
    return JSONResponse(completion, headers={COST_HEADER: str(cost)})


@router.post("/responses")
async def create_response(request: Request, identity: CurrentIdentity) -> Response:
    """The OpenAI Responses API, served as the chat it translates to (services/rollout/responses.py)."""
    body = await json_object(request, allows_nul=True)
    service = _service(request)
    if body.get("stream") is True:
        stream = await service.open_stream(identity, responses.stream_chat_body(body))
        events = responses.ResponsesStream(body, stream).events()
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    completion, cost = await service.chat(identity, responses.to_chat_body(body))
    return JSONResponse(responses.to_response(completion, body), headers={COST_HEADER: str(cost)})
