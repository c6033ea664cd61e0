"""The common frame of every service app: signed-identity check, errors, health."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request

from services.core.http import install_error_handlers
from services.core.identity import Identity, verify


async def require_identity(request: Request) -> Identity:
    """Refuse any call that did not come through the gateway (see services.core.identity)."""
    body = await request.body()
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    identity = verify(request.headers, request.app.state.internal_secret, request.method, target, body)
    request.state.request_id = identity.request_id
    return identity


CurrentIdentity = Annotated[Identity, Depends(require_identity)]


def create_service_app(name: str, *, internal_secret: str, routers: list[APIRouter]) -> FastAPI:
    app = FastAPI(title=f"rsigym-{name}", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.internal_secret = internal_secret
    install_error_handlers(app)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": name}

    for router in routers:
        app.include_router(router, dependencies=[Depends(require_identity)])

    def close() -> None:  # distributed mode: the service's own process stops
        if (stop := getattr(app.state, "close", None)) is not None:
            stop()

    app.router.on_shutdown.append(close)
    return app
