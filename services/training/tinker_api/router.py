"""Routes of the Tinker API (``$RSIGYM_URL/tinker/api/v1/…``). Thin: logic in sessions.py.

A call that does work answers at once with a future (``{"request_id", "model_id"}``); the SDK
polls ``retrieve_future``, which waits up to :data:`LONG_POLL_S` for the answer and otherwise
says ``try_again`` (Tinker's own long-poll semantics). A refusal (policy 403, budget 402, bad
request 422) is the gym's standard error on the call itself, before anything is queued.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kit.http import json_object
from kit.service_app import CurrentIdentity
from services.training.tinker_api.sessions import TinkerAPI

router = APIRouter(prefix="/tinker/api/v1")
LONG_POLL_S = 20.0
PROTO = "application/x-protobuf"

CLIENT_CONFIG: dict[str, Any] = {
    "pjwt_auth_enabled": False,  # stay on the API key: no JWT exchange
    "credential_default_source": "api_key",
    "use_pyqwest_transport": False,
    "parallel_fwdbwd_chunks": False,  # chunks in seq order, one after the other
    "proto_compress_fwdbwd": False,
    "billing_exception_max_pause_duration_sec": 0,  # a 402 is final: the budget does not come back by waiting
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}
"""The server-side flags the SDK fetches first (``/client/config``): what this gym speaks."""


def _api(request: Request) -> TinkerAPI:
    return request.app.state.tinker


async def _run(fn: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)


def _future(request_id: str, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"request_id": request_id, "model_id": model_id, **extra}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.post("/client/config")
async def client_config() -> dict[str, Any]:
    return CLIENT_CONFIG


@router.post("/client/dynamic_config")
async def client_dynamic_config() -> dict[str, Any]:
    return {"refresh_interval_sec": 3600, "sample_cancel_enabled": False}


@router.post("/telemetry")
async def telemetry() -> dict[str, str]:
    """The SDK's telemetry batches: accepted and dropped (nothing leaves the gym, nothing is kept)."""
    return {"status": "accepted"}


@router.get("/get_server_capabilities")
async def capabilities(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _api(request).capabilities()


@router.post("/create_session")
async def create_session(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _api(request).create_session(identity)


@router.post("/session_heartbeat")
async def session_heartbeat(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request)
    return _api(request).heartbeat(identity, str(body.get("session_id")))


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    await _run(_api(request).finish_session, identity, session_id)
    return {}


@router.post("/create_model")
async def create_model(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request)
    model, request_id = await _run(_api(request).create_model, identity, body)
    return _future(request_id, model.id)


@router.post("/get_info")
async def get_info(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request)
    return _api(request).get_info(identity, str(body.get("model_id")))


@router.post("/unload_model")
async def unload_model(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request)
    model_id = str(body.get("model_id"))
    return _future(await _run(_api(request).unload, identity, model_id), model_id)


@router.post("/forward_backward")
async def forward_backward(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    raw = await request.body()
    model_id, request_id = await _run(_api(request).forward_backward, identity, raw)
    return _future(request_id, model_id)


async def _json_call(request: Request, identity: Any, method: str) -> dict[str, Any]:
    body = await json_object(request)
    model_id, request_id = await _run(getattr(_api(request), method), identity, body)
    return _future(request_id, model_id)


@router.post("/optim_step")
async def optim_step(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _json_call(request, identity, "optim_step")


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _json_call(request, identity, "save_for_sampler")


@router.post("/save_weights")
async def save_weights(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _json_call(request, identity, "save_state")


@router.post("/load_weights")
async def load_weights(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _json_call(request, identity, "load_state")


@router.post("/create_sampling_session")
async def create_sampling_session(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request)
    return await _run(_api(request).create_sampling_session, identity, body)


@router.get("/samplers/{sampler_id}")
async def sampler_info(sampler_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _api(request).sampler_info(identity, sampler_id)


@router.post("/asample")
async def asample(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request)
    request_id, sequence_ids = await _run(_api(request).sample, identity, body)
    return _future(request_id, None, sample_sequence_ids=sequence_ids)


@router.post("/retrieve_future")
async def retrieve_future(request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request)
    request_id = str(body.get("request_id"))
    done = _api(request).future(identity, request_id)
    try:
        outcome = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), LONG_POLL_S)
    except TimeoutError:
        return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
    if outcome.error is not None:
        err = outcome.error
        # A failed future: the SDK raises RequestFailedError with this message (user errors are
        # the caller's to fix; the gym's error type and status lead the message).
        return JSONResponse({"error": f"{err.type} ({err.status}): {err.message}",
                             "category": "user" if err.status < 500 else "server"})
    if outcome.proto is not None:
        return Response(outcome.proto, media_type=PROTO)
    return JSONResponse(outcome.json)
