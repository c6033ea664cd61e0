"""The gateway app: the only door into the gym."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gateway import admin, agent_model, agent_routes, openai_routes
from gateway.access_log import AccessLogMiddleware
from gateway.auth import require_metrics_reader
from gateway.body_limits import install_body_limits
from gateway.context import Gateway
from gateway.health import GymHealth, job_broker
from gateway.proxy import forward
from gateway.proxy_dispatch import ProxyDispatch
from gateway.run_end import reap_run_limits
from gateway.run_monitor import MonitorLoop
from kit.errors import GymError
from kit.http import NO_FASTAPI_TELEMETRY, NulRefusal, RequestIdMiddleware, install_error_handlers

log = logging.getLogger("rsigym.gateway")

PROXY_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


async def _reaper(gw: Gateway, monitor: MonitorLoop | None = None) -> None:
    """Give back holds of crashed holders (expired reservations and slots), end runs whose
    deadline passed and start a live-monitor round (gateway/run_monitor.py), forever."""
    while True:
        await asyncio.sleep(gw.config.ledger.reaper_interval_s)
        if monitor is not None:
            monitor.kick()
        try:
            done = await gw.store.call(gw.ledger.reclaim_expired)
            slots = await gw.store.call(gw.slots.reclaim_expired)
            runs = await reap_run_limits(gw)
            if done or slots or runs:
                log.info("reaper closed %d expired reservations and %d slots, ended %d runs", done, slots, runs)
        except GymError as err:
            log.warning("reaper skipped a round: %s", err.message)


def create_gateway_app(gw: Gateway, *, run_reaper: bool = True, extra_lifespan: Any = None,
                       operator: Callable[[FastAPI, Gateway], None] | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        monitor = MonitorLoop(gw)
        task = asyncio.create_task(_reaper(gw, monitor)) if run_reaper else None
        gw.fanout.start()  # key changes announced by other replicas reach this one's principal cache
        try:
            if extra_lifespan is not None:
                async with extra_lifespan():
                    yield
            else:
                yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await monitor.stop()
            await anyio.to_thread.run_sync(gw.fanout.stop)
            health.dispose()
            await gw.aclose()

    app = FastAPI(title="RSIGym gateway", version="0.1.0", lifespan=lifespan, telemetry=NO_FASTAPI_TELEMETRY)
    app.state.gw = gw
    # The store on its own thread and connection (never queued behind calls), each service over its link.
    health = GymHealth(gw.store, gw.links, broker=job_broker())
    # Innermost of the app's middleware: proxied calls go straight to ``forward``, past the router.
    app.add_middleware(ProxyDispatch, services=set(gw.specs), methods=PROXY_METHODS, forward=forward)
    install_body_limits(app, gw)  # bodies bounded in size, time and shape while they stream in
    app.add_middleware(NulRefusal)  # no id holds NUL: 404/422 before a route looks one up
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(AccessLogMiddleware, fmt=gw.config.logging.access)  # outermost: every answer, once
    install_error_handlers(app, on_error=lambda err: gw.metrics.refusals.labels(err.type).inc())

    @app.get("/healthz", include_in_schema=False)
    async def healthz(request: Request) -> JSONResponse:
        ok, body = await health.report()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(require_metrics_reader)])
    async def metrics() -> Response:
        return Response(await gw.store.call(gw.metrics.render), media_type="text/plain; version=0.0.4")

    if operator is not None:
        # The operator side's routes and dashboard (ops/builder.py: the gateway imports no operator
        # code): before the admin router's ``/runs/{run_id}/{what}`` and the proxy's catch-all route.
        operator(app, gw)
    app.include_router(admin.router)
    app.include_router(agent_routes.router)
    app.include_router(agent_model.router)  # /agent/v1/…: before the proxy's catch-all route
    app.include_router(openai_routes.router)  # /openai/v1/…: one base URL for every model, before the catch-all

    @app.api_route("/tinker/{path:path}", methods=PROXY_METHODS, include_in_schema=False)
    async def tinker(path: str, request: Request) -> Response:
        """The Tinker SDK's API (``ServiceClient(base_url=$RSIGYM_URL/tinker)``), served by the
        training service under ``/tinker`` (its spec's ``tinker.*`` operations)."""
        return await forward(request, "training", "tinker/" + path)

    @app.api_route("/{service}/{path:path}", methods=PROXY_METHODS, include_in_schema=False)
    async def proxy(service: str, path: str, request: Request) -> Response:
        return await forward(request, service, path)

    return app

