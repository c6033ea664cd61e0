"""The common frame of every service app: signed-identity check, errors, health, shutdown.

Every service builds its app here with its routers, the objects its routes read from
``app.state`` and one shutdown hook (``close``: stop job pools, kill live sandboxes, stop
engines). The hook is ``app.state.close`` and runs exactly once, whoever stops first: the
app's own shutdown in distributed mode (``rsigym serve <service>``), or the gateway's
``aclose`` in embedded mode (ops/builder.py collects every service's ``app.state.close``).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Scope

from kit.body_limits import BodyLimits, largest_limit
from kit.config import GymConfig
from kit.direct_routes import DirectRoutes, Handler
from kit.errors import AuthenticationFailed, GymError
from kit.http import NO_FASTAPI_TELEMETRY, install_error_handlers
from kit.identity import IDENTITY_HEADER, IN_PROCESS_IDENTITY, SIGNATURE_HEADER, Identity, verify


async def require_identity(request: Request) -> Identity:
    """Refuse any call that did not come through the gateway (see kit.identity): the one check of
    a call's identity, run by every route, direct or routed. A hot route called in process by the
    embedded gateway is handed the gateway's identity object (``IN_PROCESS_IDENTITY``, set only by
    gateway/direct_call.py's transport); every other call is verified from its signed headers."""
    given = request.scope.get(IN_PROCESS_IDENTITY)
    if isinstance(given, Identity):
        request.state.request_id = given.request_id
        return given
    body = await request.body()
    # The decoded path exactly as routed (``request.url.path`` re-escapes ``?``, ``#``, backslash).
    target = request.scope["path"] + (f"?{request.url.query}" if request.url.query else "")
    identity = verify(request.headers, request.app.state.internal_secret, request.method, target, body)
    request.state.request_id = identity.request_id
    return identity


CurrentIdentity = Annotated[Identity, Depends(require_identity)]
IdentifiedEndpoint = Callable[[Request, Identity], Awaitable[Response]]


def _identified(endpoint: IdentifiedEndpoint) -> Handler:
    """``endpoint`` as its route runs it: after the signed identity is verified."""
    async def handle(request: Request) -> Response:
        return await endpoint(request, await require_identity(request))
    return handle


def once(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` callable any number of times, from any thread, running once."""
    lock, done = threading.Lock(), [False]

    def run() -> None:
        with lock:
            if done[0]:
                return
            done[0] = True
        fn()

    return run


def _signed_only(_scope: Scope, headers: Headers) -> GymError | None:
    """A service reads a body only from a caller that presents the gateway's signature headers
    (checked in full by :func:`require_identity`, which needs the body)."""
    if IDENTITY_HEADER.lower() in headers and SIGNATURE_HEADER.lower() in headers:
        return None
    return AuthenticationFailed("services accept only calls forwarded by the gym's gateway")


def create_service_app(name: str, *, internal_secret: str, routers: list[APIRouter],
                       state: Mapping[str, Any] | None = None, close: Callable[[], None] | None = None,
                       config: GymConfig | None = None,
                       direct: Mapping[tuple[str, str], IdentifiedEndpoint] | None = None) -> FastAPI:
    """``config``: the gym config whose ``http`` limits bound every request body (defaults when None).
    ``direct``: (method, path) → the endpoint a router declares there, called with the request
    and its verified identity past FastAPI's router (kit/direct_routes.py): for the
    calls an agent makes thousands of times."""
    app = FastAPI(title=f"rsigym-{name}", docs_url=None, redoc_url=None, openapi_url=None,
                  telemetry=NO_FASTAPI_TELEMETRY)
    app.state.internal_secret = internal_secret
    for attr, value in (state or {}).items():
        setattr(app.state, attr, value)
    app.state.close = once(close) if close is not None else None
    install_error_handlers(app)
    routes = {route: _identified(endpoint) for route, endpoint in (direct or {}).items()}
    # Also taken in process by the embedded gateway (gateway/direct_call.py), answered by this app's
    # exception handlers even where another ASGI app wraps this one (the sandbox service's).
    app.state.direct_routes = routes
    app.state.direct_app = app
    if routes:  # inside the body limits, like every route
        app.add_middleware(DirectRoutes, routes=routes)
    config = config or GymConfig()
    limit = largest_limit(config)  # the gateway holds each route to its own class first
    app.add_middleware(BodyLimits, http=config.http, classify=lambda _m, _p: (limit, False), gate=_signed_only)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": name}

    for router in routers:
        app.include_router(router, dependencies=[Depends(require_identity)])

    def shutdown() -> None:  # distributed mode: the service's own process stops
        if (stop := getattr(app.state, "close", None)) is not None:
            stop()

    app.router.on_shutdown.append(shutdown)
    return app
