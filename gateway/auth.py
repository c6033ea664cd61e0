"""Who is calling: run keys (agents, through the principal cache) and the admin token (operators)."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from functools import partial
from typing import Annotated

from fastapi import Depends, Request

from access.keys import Principal
from billing.deadlines import check_deadline
from gateway.access_log import note_key
from gateway.context import Gateway, gateway_of
from kit.errors import AuthenticationFailed
from kit.ids import hash_secret


def presented_key(request: Request) -> str | None:
    """``Authorization: Bearer <key>`` (OpenAI SDKs) or ``X-API-Key`` (E2B SDK)."""
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


async def authenticate(gw: Gateway, key: str | None) -> Principal:
    """A run key's principal: from this replica's cache when fresh, else from the store."""
    if not key:
        return await gw.store.call(gw.registry.authenticate, key)  # refuses with the standard message
    return _open(await _cached(gw, "key:" + hash_secret(key), partial(gw.registry.authenticate, key)))


async def authenticate_key_id(gw: Gateway, key_id: str) -> Principal:
    """The principal of a credential derived from a key (a sandbox access token)."""
    return _open(await _cached(gw, "id:" + key_id, partial(gw.registry.authenticate_id, key_id)))


def _open(principal: Principal) -> Principal:
    """The run's deadline against this call's clock (a cached principal carries ``ends_at``, never
    the verdict): ``run_ended`` from the deadline on, whichever replica or cache answers."""
    check_deadline(principal.ends_at)
    return principal


async def _cached(gw: Gateway, cache_key: str, load: Callable[[], Principal]) -> Principal:
    cache = gw.principals
    principal = cache.get(cache_key)
    if principal is not None:
        gw.metrics.principal_cache_hit.inc()
        return principal
    token = cache.begin()  # before the read: a change announced during it keeps its result out
    principal = await gw.store.call(load)
    cache.put(cache_key, principal, token)
    gw.metrics.principal_cache.labels("miss").inc()
    return principal


async def current_principal(request: Request) -> Principal:
    principal = await authenticate(gateway_of(request), presented_key(request))
    note_key(request, principal.key_id)
    return principal


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
