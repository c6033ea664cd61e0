"""Routes of the sandbox service: E2B's control plane, the daemon's file API, and the gym's
own records. Thin: logic lives in service.py, the daemon RPCs in envd.py."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import parse_qsl

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kit.errors import Conflict, GymError, InvalidRequest, NotFound, PermissionDenied, Unprocessable
from kit.http import json_object
from kit.identity import Identity
from kit.service_app import CurrentIdentity
from services.sandbox.envd import SANDBOX_HEADER
from services.sandbox.service import SandboxService

router = APIRouter()


def _svc(request: Request) -> SandboxService:
    return request.app.state.sandbox


async def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


# -- control plane (E2B API) -----------------------------------------------------------


@router.post("/operator/runs/{run_id}/end")
async def end_run(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, int]:
    """Operator only (the gateway's reaper at a run's deadline); not declared to the agent proxy."""
    return await _run(_svc(request).end_run, identity, run_id)


@router.post("/sandboxes", status_code=201)
@router.post("/v2/sandboxes", status_code=201)
async def create(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).create, identity, await json_object(request))


@router.post("/v2/templates")
async def build_template(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    """The gym's extension: build a task's Dockerfile into a template (services/sandbox/templates.py)."""
    return await _run(_svc(request).build_template, identity, await json_object(request))


@router.get("/templates")
@router.get("/v2/templates")
async def list_templates(request: Request, identity: CurrentIdentity) -> list[dict[str, Any]]:
    """E2B's template list: the configured templates and those built from Dockerfiles."""
    return await _run(_svc(request).templates)


@router.get("/sandboxes")
@router.get("/v2/sandboxes")
async def list_sandboxes(request: Request, identity: CurrentIdentity, metadata: str | None = None,
                         limit: int = 1000) -> list[dict[str, Any]]:
    svc = _svc(request)
    wanted = dict(parse_qsl(metadata)) if metadata else None
    rows = await _run(svc.list, identity, metadata=wanted, limit=max(1, min(limit, 1000)))
    return [svc.listed_view(r) for r in rows]


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    svc = _svc(request)
    return svc.detail_view(await _run(svc.owned, identity, sandbox_id))


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(sandbox_id: str, request: Request, identity: CurrentIdentity) -> JSONResponse:
    svc = _svc(request)
    body = await json_object(request) if await request.body() else {}
    row = await _run(svc.owned, identity, sandbox_id)
    if isinstance(body.get("timeout"), int):
        await _run(svc.set_timeout, identity, sandbox_id, body["timeout"])
    return JSONResponse(svc.created_view(row), status_code=200)


@router.post("/sandboxes/{sandbox_id}/pause")
@router.post("/sandboxes/{sandbox_id}/resume")
async def pause_or_resume(sandbox_id: str, request: Request, identity: CurrentIdentity) -> None:
    """Refused (400 ``not_supported``) for a sandbox the caller may reach: service.py says why."""
    action = "resume" if request.url.path.endswith("/resume") else "pause"
    await _run(_svc(request).refuse_lifecycle, identity, sandbox_id, action)


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: str, request: Request, identity: CurrentIdentity) -> Response:
    await _run(_svc(request).kill, identity, sandbox_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, request: Request, identity: CurrentIdentity) -> Response:
    body = await json_object(request)
    await _run(_svc(request).set_timeout, identity, sandbox_id, body.get("timeout"))
    return Response(status_code=204)


@router.put("/sandboxes/{sandbox_id}/network")
async def update_network(sandbox_id: str, request: Request, identity: CurrentIdentity) -> Response:
    await _run(_svc(request).check_owned, identity, sandbox_id)
    raise PermissionDenied("a sandbox's network is set by the key's policy, not by the sandbox's owner")


# -- the gym's own records -------------------------------------------------------------


@router.get("/v1/sandboxes")
async def records(request: Request, identity: CurrentIdentity, state: str | None = None) -> dict[str, Any]:
    svc = _svc(request)
    rows = await _run(svc.list, identity, running_only=state == "running")
    return {"object": "list", "data": [svc.record_view(r) for r in rows if state in (None, r.state)]}


@router.get("/v1/sandboxes/{sandbox_id}")
async def record(sandbox_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    svc = _svc(request)
    return svc.record_view(await _run(svc.owned, identity, sandbox_id, running=False))


# -- the daemon's plain HTTP routes ----------------------------------------------------


async def _sandbox_of(request: Request, identity: Identity) -> str:
    sandbox_id = request.headers.get(SANDBOX_HEADER)
    if not sandbox_id:
        raise InvalidRequest("the E2b-Sandbox-Id header is required")
    await _svc(request).check_owned_async(identity, sandbox_id)
    return sandbox_id


@router.get("/envd/health", status_code=204)
async def health(request: Request, identity: CurrentIdentity) -> Response:
    return Response(status_code=204)


@router.get("/envd/files")
async def read_file(request: Request, identity: CurrentIdentity) -> Response:
    """A direct route too (app.py: every agent's file reads): the query is read here, not by FastAPI."""
    path = request.query_params.get("path")
    if path is None:
        raise Unprocessable("the path query parameter is required", param="path")
    svc = _svc(request)
    sandbox_id = await _sandbox_of(request, identity)
    limit = svc.config.max_file_transfer_mb * 1024 * 1024
    answer = await svc.backend.call(sandbox_id, {"op": "read", "path": path, "limit": limit})
    if "error" in answer:
        raise _http_error(answer["error"])
    return Response(base64.b64decode(answer["data"]), media_type="application/octet-stream")


@router.post("/envd/files")
async def write_files(request: Request, identity: CurrentIdentity) -> JSONResponse:
    """A direct route too (app.py: every agent's file writes): the query is read here, not by FastAPI."""
    path = request.query_params.get("path")
    svc = _svc(request)
    sandbox_id = await _sandbox_of(request, identity)
    limit = svc.config.max_file_transfer_mb * 1024 * 1024
    uploads: list[tuple[str, bytes]] = []
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        async with request.form(max_files=1000, max_part_size=limit) as form:  # its spooled files closed after
            for item in form.getlist("file"):
                if isinstance(item, str) or not hasattr(item, "read"):
                    raise Unprocessable("each 'file' part must be a file")
                target = path if path and len(form.getlist("file")) == 1 else item.filename
                uploads.append((target or "", await item.read()))
    else:
        if not path:
            raise Unprocessable("the path query parameter is required", param="path")
        uploads.append((path, await request.body()))
    written = []
    for target, data in uploads:
        if len(data) > limit:
            raise InvalidRequest(f"file over {svc.config.max_file_transfer_mb} MiB: {target}", param="path")
        answer = await svc.backend.call(sandbox_id, {"op": "write", "path": target,
                                                     "data": base64.b64encode(data).decode()})
        if "error" in answer:
            raise _http_error(answer["error"])
        e = answer["entry"]
        written.append({"name": e["name"], "type": e["type"], "path": e["path"]})
    return JSONResponse(written)


def _http_error(error: dict[str, Any]) -> GymError:
    code = error.get("code")
    message = str(error.get("message", "sandbox error"))
    cls: type[GymError] = {"not_found": NotFound, "permission_denied": PermissionDenied,
                           "already_exists": Conflict}.get(code, InvalidRequest)  # type: ignore[arg-type]
    return cls(message, param="path")

