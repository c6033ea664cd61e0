"""The gateway's request bounds (kit/body_limits.py): which class each route's body
belongs to, and which credential it must present before its body is read."""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from starlette.datastructures import Headers
from starlette.types import Scope

from gateway.auth import presented_key
from gateway.context import Gateway
from kit.body_limits import BodyLimits, RouteLimit, class_limit
from kit.errors import AuthenticationFailed, GymError

ADMIN_API = "/admin/v1/"
DASHBOARD = "/admin/ui"
"""The dashboard's login form posts the admin token in its body: bounded as a JSON call."""


class GatewayRoutes:
    """Classifier and gate of :class:`BodyLimits` for one gateway."""

    def __init__(self, gw: Gateway):
        self.gw = gw

    def classify(self, method: str, path: str) -> RouteLimit:
        service, _, rest = path.lstrip("/").partition("/")
        spec = self.gw.specs.get(service)
        op = spec.match(method, "/" + rest) if spec is not None else None
        return class_limit(self.gw.config, op.body_limit if op is not None else "json")

    def gate(self, scope: Scope, headers: Headers) -> GymError | None:
        """No body is read from a caller that presents no credential at all, nor on the admin API
        from one without the admin token. A presented run key is checked by the route, before
        it reads the body (gateway/proxy.py authenticates first)."""
        path = scope.get("path", "")
        if path.startswith(DASHBOARD):
            return None
        key = presented_key(Request(scope))
        if path.startswith(ADMIN_API):
            expected = self.gw.admin_token.encode()
            if key and hmac.compare_digest(key.encode(), expected):
                return None
            return AuthenticationFailed("admin routes need the operator's admin token")
        if key or headers.get("x-access-token"):
            return None
        return AuthenticationFailed("this call needs a run key (Authorization: Bearer <key> or X-API-Key)")


def install_body_limits(app: FastAPI, gw: Gateway) -> None:
    """Before the request-id middleware is added (so it wraps this one and refusals carry the id)."""
    routes = GatewayRoutes(gw)
    app.add_middleware(BodyLimits, http=gw.config.http, classify=routes.classify, gate=routes.gate,
                       on_refusal=lambda err: gw.metrics.refusals.labels(err.type).inc())
