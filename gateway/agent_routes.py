"""Routes a run key calls on the gateway itself: its own key, balance and child keys."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request

from billing import agent_meter
from billing.money import usd_to_nusd
from billing.storage_quota import StorageQuota
from gateway.admin import parse_policy
from gateway.auth import CurrentPrincipal
from gateway.context import gateway_of
from gateway.schemas import MintChildKey
from kit.http import TextJsonRoute

router = APIRouter(prefix="/v1", route_class=TextJsonRoute)


@router.get("/balance")
async def balance(principal: CurrentPrincipal, request: Request) -> dict[str, Any]:
    """The key's service budget, and the run's agent-model meter apart (``agent_model``: the
    same four figures, or null when the run has none), and the run's disk (``storage``: bytes
    used of its quota, by kind; billing/storage_quota.py)."""
    gw = gateway_of(request)
    service = (await gw.store.call(gw.ledger.balance, principal.key_id)).as_usd()
    agent = await gw.store.call(partial(agent_meter.meter_balance, gw.store, principal.run_id))
    storage = await gw.store.call(StorageQuota.of(gw.context).usage, principal.run_id)
    return {**service, "agent_model": agent, "storage": storage}


@router.get("/key")
async def own_key(principal: CurrentPrincipal, request: Request) -> dict[str, Any]:
    """The calling key as the admin sees it (track, status, budget, ``ends_at``, its own policy)
    and ``effective_policies``: every policy of its chain, root first — a call must satisfy all of
    them. An agent reads what its track grants and fixes here instead of probing with calls the
    gateway would refuse (and record as refusals)."""
    gw = gateway_of(request)
    view = await gw.store.call(gw.registry.get, principal.key_id)
    return {**view, "effective_policies": [p.model_dump(mode="json") for p in principal.policies]}


@router.post("/keys", status_code=201)
async def mint_child(body: MintChildKey, principal: CurrentPrincipal, request: Request) -> dict[str, Any]:
    """A narrower key for a research role: subset of this key's permissions, same budget."""
    gw = gateway_of(request)
    policy = parse_policy(body.policy, gw.specs) if body.policy is not None else principal.policies[-1]
    view, plaintext = await gw.store.call(
        partial(
            gw.registry.create,
            policy=policy,
            budget_nusd=None if body.budget_usd is None else usd_to_nusd(body.budget_usd),
            name=body.name,
            parent_id=principal.key_id,
        )
    )
    return {**view, "key": plaintext}


@router.get("/keys")
async def list_children(principal: CurrentPrincipal, request: Request) -> dict[str, Any]:
    gw = gateway_of(request)
    return {"data": await gw.store.call(partial(gw.registry.list, parent_id=principal.key_id))}


@router.post("/keys/{key_id}/revoke")
async def revoke_child(key_id: str, principal: CurrentPrincipal, request: Request) -> dict[str, Any]:
    gw = gateway_of(request)
    return await gw.store.call(partial(gw.registry.set_status, key_id, "revoked", parent_id=principal.key_id))
