"""Builds the sandbox service app (its operations are declared in spec.py, served under
``/sandbox``): the FastAPI app for the control plane, wrapped by the envd daemon dispatcher."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.datastructures import Headers

from kit.errors import GymError, error_response
from kit.identity import verify
from kit.service_app import create_service_app
from kit.spec import ServiceContext
from services.sandbox.api import read_file, router, write_files
from services.sandbox.backends import SANDBOX_BACKENDS
from services.sandbox.backends.base import SandboxBackend
from services.sandbox.envd import CURRENT_IDENTITY, connect_apps
from services.sandbox.service import SandboxService
from services.sandbox.spec import SPEC

__all__ = ["SPEC", "EnvdDispatch", "create_app", "make_backend"]

MAX_RPC_BODY = 16 * 1024 * 1024


def make_backend(context: ServiceContext) -> SandboxBackend:
    return SANDBOX_BACKENDS.get(context.config.sandbox.backend)(context)


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
    service = SandboxService(context, backend or make_backend(context))
    service.recover()
    app = create_service_app("sandbox", internal_secret=context.internal_secret, routers=[router],
                             config=context.config, state={"sandbox": service}, close=service.shutdown,
                             direct={("GET", "/envd/files"): read_file, ("POST", "/envd/files"): write_files})
    return EnvdDispatch(app, service, context.internal_secret)
