"""Hot routes past FastAPI's router: a pure-ASGI dispatcher for the few calls every research agent
makes thousands of times.

A route reached through FastAPI is matched against every route before it, has its dependencies
solved, and runs inside the exception and exit-stack middleware; for the rollout service's chat
completion that frame was a large part of the call under cProfile, and skipping it cut what the
gateway adds, paired per round (docs/performance.md). The
gateway's :class:`gateway.proxy_dispatch.ProxyDispatch` and a service's direct routes
(:func:`kit.service_app.create_service_app`) take such a call straight to its handler
instead. They sit inside the app's own middleware (request id, access log, body limits), so
those wrap a direct call as they wrap every route, and a refusal is answered by the exception
handlers the app registered (:func:`answer`); the FastAPI route stays declared as well,
so the app still lists it and the handler is the same function.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Handler = Callable[[Request], Awaitable[Response]]


class DirectRoutes:
    """Pure ASGI: ``routes`` maps (method, path) — the path as the app sees it, below its
    ``root_path`` — to a handler; any other request goes on to the app."""

    def __init__(self, app: ASGIApp, *, routes: Mapping[tuple[str, str], Handler]):
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handler = self.routes.get((scope["method"], app_path(scope)))
        if handler is None:
            await self.app(scope, receive, send)
            return
        await answer(scope, receive, send, handler)


def app_path(scope: Scope) -> str:
    """The request's path below the app's ``root_path`` (as Starlette's router matches it)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


async def answer(scope: Scope, receive: Receive, send: Send, handler: Handler) -> None:
    """Run ``handler`` and send its response, or what the app's handler for its error answers."""
    request = Request(scope, receive)
    try:
        response = await handler(request)
    except Exception as err:  # noqa: BLE001 - answered by the app's own handler, or raised as before
        answered = await error_answer(request, err)
        if answered is None:
            raise
        response = answered
    await response(scope, receive, send)


async def error_answer(request: Request, err: Exception, *, catch_all: bool = False) -> Response | None:
    """The answer of the request's app (``scope["app"]``) to ``err``: the exception handler Starlette's
    exception middleware would pick (:func:`handler_for`) or, with ``catch_all``, its ``Exception``
    handler (which the app's server-error middleware runs where that middleware is on the path);
    None when it has neither."""
    handlers = request.scope["app"].exception_handlers
    on_error = handler_for(handlers, err) or (handlers.get(Exception) if catch_all else None)
    return None if on_error is None else await on_error(request, err)


def handler_for(handlers: dict[Any, Any], err: Exception) -> Any:
    """The handler Starlette's exception middleware would pick: the nearest class in the error's
    MRO, status-code handlers and the catch-all ``Exception`` (the server-error middleware's) left out."""
    for cls in type(err).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
