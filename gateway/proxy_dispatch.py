"""The proxied calls' short way through the gateway app: ``/{service}/…`` straight to
:func:`gateway.proxy.forward`, past FastAPI's router, its dependency solving and the exception and
exit-stack middleware around them.

Every call a research agent makes to a service (a chat completion, a sandbox's daemon RPC, a
training step) is one of these, and the router found it last, after every admin, agent, OpenAI
and dashboard route had been tried: of the ~3.3 ms the gateway added to one in-process rollout
call, ~1 ms was that frame (py-spy, cProfile; docs/performance.md). Everything else is unchanged:
the dispatcher is the innermost of the app's own middleware, so the access log, the request id
and the body limits wrap it as they wrap every route, and a refusal is answered by the very
exception handlers the app registered (an exception none of them takes propagates as it did, to
the server-error handler). The services' own hot routes go the same way
(kit/direct_routes.py, which both use).

It takes a path only where the router would have reached the proxy's catch-all anyway: the
method is one the catch-all serves and the first segment names a service of this gateway. The
gateway's own routes live under other first segments (``GATEWAY_SEGMENTS``; a test walks the
app's routes and checks it), so no route of its own is ever passed over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kit.direct_routes import answer, app_path

Forward = Callable[[Request, str, str], Awaitable[Response]]


GATEWAY_SEGMENTS = frozenset({"admin", "agent", "openai", "tinker", "v1", "healthz", "metrics", "docs", "redoc",
                               "openapi.json"})
"""First path segments of the gateway's own routes: no service may be named like one."""


class ProxyDispatch:
    """Pure ASGI; see the module docstring. ``services``: the gateway's service names;
    ``methods``: those its catch-all route serves."""

    def __init__(self, app: ASGIApp, *, services: set[str], methods: list[str], forward: Forward):
        clash = set(services) & GATEWAY_SEGMENTS
        if clash:
            raise ValueError(f"a service may not be named like a gateway route: {sorted(clash)}")
        self.app = app
        self.services = frozenset(services)
        self.methods = frozenset(methods)
        self.forward = forward

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        path = app_path(scope)
        service, slash, rest = path[1:].partition("/")
        if not slash or not path.startswith("/") or service not in self.services:
            await self.app(scope, receive, send)
            return
        await answer(scope, receive, send, lambda request: self.forward(request, service, rest))
