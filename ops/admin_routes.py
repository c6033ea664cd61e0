"""The operator side's admin routes, served by the gateway under ``/admin/v1`` with the admin token
like gateway/admin.py's: every run's lists (ops/admin_lists.py), a run's trajectory and its
timeline (ops/timeline.py), and the dashboard under ``/admin/ui``. The composition root
(ops/builder.py) adds them with :func:`mount_operator`, so the gateway imports no operator code.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response

from gateway.auth import require_admin
from gateway.context import Gateway, gateway_of
from kit.http import TextJsonRoute
from ops import timeline
from ops.admin_lists import DEFAULT_LIMIT, KINDS, list_rows
from ops.dashboard import mount_dashboard
from services.records import agent_turns

router = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_admin)], route_class=TextJsonRoute)


def mount_operator(app: FastAPI, gw: Gateway) -> None:
    """The gateway's ``operator`` hook: these routes, then the dashboard."""
    app.include_router(router)
    mount_dashboard(app, gw)


# -- what runs made, across runs (datasets, jobs, checkpoints, sandboxes, submissions) --


def _list_route(kind: str) -> Any:
    async def list_kind(request: Request, run_id: str | None = None, key_id: str | None = None,
                        status: str | None = None, limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> dict[str, Any]:
        gw = gateway_of(request)
        return await gw.store.call(partial(list_rows, gw.store, kind, run_id=run_id, key_id=key_id, status=status,
                                           limit=limit, cursor=cursor))

    list_kind.__doc__ = (f"Every run's {kind}, newest first: ``?run_id=``, ``?key_id=``, ``?status=``, "
                         "``?limit=`` (≤ 500) and ``?cursor=`` (the page's ``next_cursor``).")
    list_kind.__name__ = f"list_{kind.replace('-', '_')}"
    return list_kind


for _kind, _spec in KINDS.items():
    router.add_api_route(_spec.path, _list_route(_kind), methods=["GET"])


# -- one run: its agent's trajectory and its timeline (included before the gateway's /runs/{run_id}/{what}) --


@router.get("/runs/{run_id}/trajectory")
async def run_trajectory(run_id: str, request: Request, text: bool = False) -> Any:
    """The research agent's trajectory: every call it made on the agent route, in order
    (``?text=true``: rendered as plain text, what the audits' judge reads)."""
    gw = gateway_of(request)
    turns = await gw.store.call(partial(agent_turns.run_turns, gw.store, run_id))
    if text:
        return Response(agent_turns.render_text(turns), media_type="text/plain; charset=utf-8")
    return {"run_id": run_id, "data": turns}


@router.get("/runs/{run_id}/timeline")
async def run_timeline(run_id: str, request: Request) -> dict[str, Any]:
    """When the run started, time to its first training job, research hours, experiments and
    spend by service over time (computed from the store)."""
    gw = gateway_of(request)
    return await gw.store.call(timeline.run_timeline, gw.store, run_id)
