"""Routes of the training service. Thin: logic lives in service.py and jobs.py."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from kit.http import json_object
from kit.service_app import CurrentIdentity
from services.training.checkpoints import checkpoint_view
from services.training.service import TrainingService

router = APIRouter(prefix="/v1")


def _svc(request: Request) -> TrainingService:
    return request.app.state.training


async def _run(fn: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)


@router.post("/datasets", status_code=201)
async def upload_dataset(request: Request, identity: CurrentIdentity, name: str | None = None) -> dict[str, Any]:
    raw = await request.body()
    svc = _svc(request)
    return await _run(lambda: svc.datasets.upload(run_id=identity.run_id, key_id=identity.key_id, raw=raw, name=name))


@router.get("/datasets")
async def list_datasets(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return {"object": "list", "data": await _run(_svc(request).datasets.list, identity.run_id)}


@router.get("/datasets/{dataset_id}/content")
async def dataset_content(dataset_id: str, request: Request, identity: CurrentIdentity) -> Response:
    content = await _run(_svc(request).dataset_content, identity, dataset_id)
    return Response(content, media_type="application/jsonl")


@router.post("/jobs", status_code=201)
async def create_job(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request)
    return await _run(_svc(request).submit, identity, body)


@router.get("/jobs")
async def list_jobs(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return {"object": "list", "data": await _run(_svc(request).list_jobs, identity)}


@router.get("/jobs/{job_id}")
async def get_job(job_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).runner.get, job_id, identity.run_id)


@router.post("/jobs/{job_id}/cancel")
async def cancel_job(job_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).cancel, identity, job_id)


@router.get("/jobs/{job_id}/logs")
async def job_logs(job_id: str, request: Request, identity: CurrentIdentity) -> PlainTextResponse:
    return PlainTextResponse(await _run(_svc(request).runner.logs, job_id, identity.run_id))


@router.post("/operator/runs/{run_id}/end")
async def end_run(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, int]:
    """Operator only (the gateway's reaper at a run's deadline); not declared to the agent proxy."""
    return await _run(_svc(request).end_run, identity, run_id)


@router.get("/checkpoints")
async def list_checkpoints(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return {"object": "list", "data": await _run(_svc(request).registry.list, identity.run_id)}


@router.get("/checkpoints/{ckpt_id}")
async def get_checkpoint(ckpt_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    row = await _run(lambda: _svc(request).registry.get(ckpt_id, run_id=identity.run_id))
    return checkpoint_view(row)
