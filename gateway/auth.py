"""Who is calling: run keys (agents) and the admin token (operators)."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from gateway.context import gateway_of
from services.core.errors import AuthenticationFailed
from services.core.keys import Principal


def presented_key(request: Request) -> str | None:
    """``Authorization: Bearer <key>`` (OpenAI SDKs) or ``X-API-Key`` (E2B SDK)."""
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


async def current_principal(request: Request) -> Principal:
    gw = gateway_of(request)
    return await gw.store.call(gw.registry.authenticate, presented_key(request))


async def require_admin(request: Request) -> None:
    token = presented_key(request) or ""
    expected = gateway_of(request).admin_token
    if not token or not hmac.compare_digest(token.encode(), expected.encode()):
        raise AuthenticationFailed("admin routes need the operator's admin token")


async def require_metrics_reader(request: Request) -> None:
    """``/metrics``: the admin token, or the scrape token (RSIGYM_METRICS_TOKEN) when one is set.
    Metrics name services, models, refusal types and spend: not for whoever reaches the port."""
    gw = gateway_of(request)
    token = (presented_key(request) or "").encode()
    accepted = [gw.admin_token, gw.context.settings.metrics_token or ""]
    if not token or not any(t and hmac.compare_digest(token, t.encode()) for t in accepted):
        raise AuthenticationFailed("/metrics needs the admin token or the gym's metrics scrape token")


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
