"""One OpenAI base URL for every model a key may use: ``<gym>/openai/v1``.

An OpenAI client pointed there reaches the rollout catalogue's models (teachers, judges) and the
inference service's (base models and the run's checkpoints) by name alone. Nothing new is
metered here: a chat is handed to :func:`gateway.proxy.forward` as the rollout or the inference
service's own chat route — the same policy, reservation, settlement, rate limits, refusal records
and cost headers as a call on ``/rollout/v1`` or ``/inference/v1``, which stay. A catalogue name
wins over a base model's (the gym config refuses one name in both); anything else, checkpoint ids
included, is the inference service's to resolve or refuse.

``POST /openai/v1/responses`` (the OpenAI Responses API) is the rollout service's, which serves
it as the chat it translates to (services/rollout/responses.py): a catalogue name is forwarded
there; the inference service has no Responses API, so any other model is a 400 naming the route
that does serve it (chat completions), before anything is parsed further or held.

``GET /openai/v1/models`` lists both services' models, each as its own route lists them for this
key; a service the key is not granted is left out rather than refused (a harness-track key sees no
catalogue), so listing models never lands a refusal on the run's record.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.auth import authenticate, presented_key
from gateway.context import gateway_of
from gateway.proxy import check_grant, forward
from kit.errors import InvalidRequest, PermissionDenied

router = APIRouter(prefix="/openai/v1")

CHAT = "v1/chat/completions"
RESPONSES = "v1/responses"
SERVICES = ("rollout", "inference")


def _model_of(raw: bytes) -> str | None:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


@router.post("/chat/completions", response_model=None)
async def chat(request: Request) -> Response:
    """A chat with any model the key may use, routed by its ``model``."""
    gw = gateway_of(request)
    await authenticate(gw, presented_key(request))  # no body is parsed for a caller without a key
    model = _model_of(await request.body())
    service = "rollout" if model is not None and gw.config.rollout.model(model) is not None else "inference"
    return await forward(request, service, CHAT)


@router.post("/responses", response_model=None)
async def responses(request: Request) -> Response:
    """The Responses API with a catalogue model (the rollout service's); refused for any other."""
    gw = gateway_of(request)
    await authenticate(gw, presented_key(request))
    model = _model_of(await request.body())
    if model is None or gw.config.rollout.model(model) is None:
        raise InvalidRequest(f"model {model!r} is not served on the Responses API here: only the rollout catalogue's "
                             "models are; base models and checkpoints answer on /openai/v1/chat/completions",
                             param="model")
    return await forward(request, "rollout", RESPONSES)


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    """Every model the key may call here: the catalogue's, then base models and checkpoints."""
    gw = gateway_of(request)
    principal = await authenticate(gw, presented_key(request))
    listed: list[dict[str, Any]] = []
    for service in SERVICES:
        try:
            check_grant(principal, service)
        except PermissionDenied:
            continue
        answered = await forward(request, service, "v1/models")
        listed.extend(json.loads(bytes(answered.body))["data"])
    return {"object": "list", "data": listed}
