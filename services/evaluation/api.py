"""Routes of the evaluation service. Thin: logic lives in service.py, jobs.py, registry.py.

``/v1/operator/…`` routes are not declared to the gateway's agent proxy: only the gateway's
admin routes reach them, with a signed operator identity."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from kit.http import json_object
from kit.service_app import CurrentIdentity
from services.evaluation.service import EvaluationService

router = APIRouter(prefix="/v1")


def _svc(request: Request) -> EvaluationService:
    return request.app.state.evaluation


async def _run(fn: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: fn(*args))


def _list(data: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": data}


@router.get("/benchmarks")
async def benchmarks(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).list_benchmarks, identity))


@router.get("/benchmarks/{name}/training-pool")
async def training_pool(name: str, request: Request, identity: CurrentIdentity) -> FileResponse:
    """The benchmark's training pool as JSONL, one ``{"question": …}`` per line."""
    path = await _run(_svc(request).training_pool, identity, name)
    return FileResponse(path, media_type="application/jsonl", filename=f"{name}-training-pool.jsonl")


@router.post("/harnesses", status_code=201)
async def upload_harness(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).upload_harness, identity, await request.body())


@router.get("/harnesses")
async def harnesses(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).harnesses.list, identity.run_id))


@router.post("/jobs", status_code=201)
async def create_job(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).create_job, identity, await json_object(request))


@router.get("/jobs")
async def list_jobs(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).list_jobs, identity))


@router.get("/jobs/{job_id}")
async def get_job(job_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).get_job, identity, job_id)


@router.get("/jobs/{job_id}/results")
async def results(job_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).results, identity, job_id))


@router.post("/jobs/{job_id}/cancel")
async def cancel(job_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).cancel, identity, job_id)


@router.post("/submissions", status_code=201)
async def submit(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).submit, identity, await json_object(request))


@router.get("/submissions")
async def submissions(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).submissions, identity))


# -- operator routes (reached only through the gateway's admin API) --------------------


@router.post("/operator/benchmarks", status_code=201)
async def register_benchmark(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).register_benchmark, identity, await json_object(request))


@router.post("/operator/runs/{run_id}/score", status_code=202)
async def score_run(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request) if await request.body() else {}
    return await _run(_svc(request).score_run, identity, run_id, body)


@router.post("/operator/runs/{run_id}/end")
async def end_run(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    """The gateway's reaper at a run's deadline: cancel the run's jobs."""
    return await _run(_svc(request).end_run, identity, run_id)


@router.get("/operator/scores")
async def scores(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).scores, identity))


@router.get("/operator/runs/{run_id}/submissions")
async def run_submissions(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).submissions, identity, run_id))
