"""Routes of the inference service (OpenAI-compatible). Thin: logic lives in service.py."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kit.http import ClosingStreamingResponse, json_object
from kit.identity import COST_HEADER
from kit.service_app import CurrentIdentity
from services.inference.service import InferenceService

router = APIRouter(prefix="/v1")


def _svc(request: Request) -> InferenceService:
    return request.app.state.inference


@router.get("/models")
async def list_models(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    service = _svc(request)
    return {"object": "list", "data": await anyio.to_thread.run_sync(service.list_models, identity, limiter=service.limiter)}


@router.post("/chat/completions")
async def chat_completions(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request, allows_nul=True)
    if body.get("stream") is True:
        stream = await _svc(request).open_stream(identity, body)
        # Closing: a reader that goes away stops the generation before this call returns.
        return ClosingStreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    completion, cost = await _svc(request).chat(identity, body)
    return JSONResponse(completion, headers={COST_HEADER: str(cost)})
