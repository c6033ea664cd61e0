"""Builds the sandbox service app and declares its operations to the gateway.

The gateway serves it under ``/sandbox``: an agent points the unmodified E2B SDK at
``E2B_API_URL=<gym>/sandbox`` and ``E2B_SANDBOX_URL=<gym>/sandbox/envd`` with
``E2B_API_KEY=<run key>``. Control-plane calls authenticate with the key (X-API-Key);
daemon calls carry only the sandbox's access token, which the gateway verifies
(``auth="sandbox_token"``). No call is metered per request: sandbox time is metered by the
second, ahead, by the service itself (services/sandbox/metering.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.datastructures import Headers

from services.core.errors import GymError, error_response
from services.core.identity import verify
from services.core.service_app import create_service_app
from services.core.spec import Operation, ServiceContext, ServiceSpec
from services.sandbox.api import router
from services.sandbox.backends.base import SandboxBackend
from services.sandbox.envd import CURRENT_IDENTITY, connect_apps
from services.sandbox.service import CreateSandbox, SandboxService

MAX_RPC_BODY = 16 * 1024 * 1024


def _op(method: str, path: str, name: str, **kw: Any) -> Operation:
    return Operation(method, path, name, concurrency=False, **kw)


_DAEMON = dict(auth="sandbox_token")

SPEC = ServiceSpec(
    name="sandbox",
    operations=(
        _op("POST", "/sandboxes", "sandboxes.create", json_body=True, schema=CreateSandbox),
        _op("POST", "/v2/sandboxes", "sandboxes.create", json_body=True, schema=CreateSandbox),
        _op("GET", "/sandboxes", "sandboxes.list"),
        _op("GET", "/v2/sandboxes", "sandboxes.list"),
        _op("GET", "/sandboxes/{id}", "sandboxes.get"),
        _op("DELETE", "/sandboxes/{id}", "sandboxes.kill"),
        _op("POST", "/sandboxes/{id}/timeout", "sandboxes.timeout"),
        _op("POST", "/sandboxes/{id}/connect", "sandboxes.connect"),
        _op("POST", "/v2/sandboxes/{id}/connect", "sandboxes.connect"),
        _op("PUT", "/sandboxes/{id}/network", "sandboxes.network"),
        _op("GET", "/v1/sandboxes", "records.list"),
        _op("GET", "/v1/sandboxes/{id}", "records.get"),
        _op("GET", "/envd/health", "envd.health", **_DAEMON),
        _op("GET", "/envd/files", "envd.files.read", **_DAEMON),
        _op("POST", "/envd/files", "envd.files.write", **_DAEMON),
        _op("POST", "/envd/process.Process/{method}", "envd.process", **_DAEMON),
        _op("POST", "/envd/filesystem.Filesystem/{method}", "envd.filesystem", **_DAEMON),
    ),
)


def make_backend(context: ServiceContext) -> SandboxBackend:
    cfg = context.config.sandbox
    if cfg.backend == "e2b":
        from services.sandbox.backends.e2b_cloud import E2BCloudBackend

        return E2BCloudBackend.from_context(context)
    from services.sandbox.backends.local import LocalBackend

    return LocalBackend(cfg.local_root, cfg.uid_base)


class EnvdDispatch:
    """Outer ASGI app: daemon RPCs go to the e2b package's Connect apps once the gateway's
    signature is verified; everything else goes to the FastAPI app."""

    def __init__(self, app: FastAPI, service: SandboxService, secret: str):
        self.app, self.secret = app, secret
        self.connect = connect_apps(service)
        self.state = app.state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        target = next((p for p in self.connect if path.startswith("/envd" + p)), None)
        if target is None:
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_RPC_BODY:
                break
        headers = Headers(scope=scope)
        query = scope.get("query_string", b"").decode("latin-1")
        try:
            if len(body) > MAX_RPC_BODY:
                raise GymError(f"request body over {MAX_RPC_BODY} bytes")
            identity = verify(headers, self.secret, scope["method"], path + (f"?{query}" if query else ""), body)
        except GymError as err:
            await error_response(err, headers.get("x-request-id"))(scope, receive, send)
            return

        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        token = CURRENT_IDENTITY.set(identity)
        try:
            inner = dict(scope, path=path[len("/envd"):], raw_path=path[len("/envd"):].encode())
            await self.connect[target](inner, replay, send)
        finally:
            CURRENT_IDENTITY.reset(token)


def create_app(context: ServiceContext, backend: SandboxBackend | None = None) -> EnvdDispatch:
    app = create_service_app("sandbox", internal_secret=context.internal_secret, routers=[router])
    service = SandboxService(context, backend or make_backend(context))
    service.recover()
    app.state.sandbox = service
    app.state.close = service.shutdown
    return EnvdDispatch(app, service, context.internal_secret)
