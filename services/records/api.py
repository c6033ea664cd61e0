"""Routes of the records service. Thin: logic lives in service.py, scope.py and queries.py.

There is deliberately no route that writes a platform event: agents create experiments and
annotations only. ``/v1/operator/…`` routes are not declared to the gateway's agent proxy: only
the gateway's admin routes reach them, with a signed operator identity."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request

from kit.http import json_object
from kit.service_app import CurrentIdentity
from services.records.service import RecordsService

router = APIRouter(prefix="/v1")


def _svc(request: Request) -> RecordsService:
    return request.app.state.records


async def _run(fn: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: fn(*args))


def _list(data: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": data}


def _params(request: Request) -> dict[str, str]:
    return dict(request.query_params)


@router.get("/events")
async def events(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).list_events, identity, _params(request))


@router.get("/experiments")
async def experiments(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).list_experiments, identity))


@router.post("/experiments", status_code=201)
async def create_experiment(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).create_experiment, identity, await json_object(request))


@router.get("/experiments/{experiment_id}")
async def experiment(experiment_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).get_experiment, identity, experiment_id)


@router.get("/experiments/{a}/diff/{b}")
async def diff(a: str, b: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).diff, identity, a, b)


@router.get("/checkpoints/{checkpoint_id}/lineage")
async def lineage(checkpoint_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).lineage, identity, checkpoint_id)


@router.get("/best-checkpoint")
async def best_checkpoint(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).best_checkpoint, identity, _params(request))


@router.post("/annotations", status_code=201)
async def annotate(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).create_annotation, identity, await json_object(request))


@router.get("/annotations")
async def list_annotations(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).list_annotations, identity, _params(request)))


@router.get("/chain")
async def chain(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).chain, identity)


# -- operator routes (reached only through the gateway's admin API) --------------------


@router.get("/operator/runs/{run_id}/events")
async def run_events(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).operator_events, identity, run_id, _params(request))


@router.get("/operator/runs/{run_id}/experiments")
async def run_experiments(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).operator_experiments, identity, run_id))


@router.get("/operator/runs/{run_id}/chain")
async def run_chain(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return await _run(_svc(request).operator_chain, identity, run_id)


@router.get("/operator/audits")
async def audits(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    return _list(await _run(_svc(request).operator_audits, identity, _params(request)))


@router.post("/operator/runs/{run_id}/audit")
async def audit(run_id: str, request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    body = await json_object(request) if await request.body() else {}
    return await _run(_svc(request).operator_audit, identity, run_id, body)


@router.post("/operator/monitor")
async def monitor(request: Request, identity: CurrentIdentity) -> dict[str, Any]:
    """One round of the live monitor (the gateway's reaper asks every round; gateway/run_monitor.py)."""
    return await _run(_svc(request).operator_monitor, identity)
