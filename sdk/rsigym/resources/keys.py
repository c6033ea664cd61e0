"""``gym.keys``: child keys minted from the run's own key.

A child key spends from its parent's budget (optionally capped by ``budget_usd``) and
may be narrowed by a ``policy`` – e.g. to hand a harness one model, inference only.
"""

from __future__ import annotations

from typing import Any

from .._base_client import APICall
from .._response import ObjectList, parse_list, parse_object
from ..types import ChildKey
from ._resource import AsyncResource, SyncResource, drop_none, path_id


def mint_call(*, name: str | None, policy: dict[str, Any] | None, budget_usd: float | None) -> APICall[ChildKey]:
    body = drop_none({"name": name, "policy": policy, "budget_usd": budget_usd})
    return APICall("POST", "/v1/keys", parse_object(ChildKey), json=body)


def list_call() -> APICall[ObjectList[ChildKey]]:
    return APICall("GET", "/v1/keys", parse_list(ChildKey))


def revoke_call(key_id: str) -> APICall[ChildKey]:
    return APICall("POST", f"/v1/keys/{path_id(key_id)}/revoke", parse_object(ChildKey))


class Keys(SyncResource):
    def mint(
        self, *, name: str | None = None, policy: dict[str, Any] | None = None, budget_usd: float | None = None
    ) -> ChildKey:
        """Mint a child key. The answer's ``key`` is the only time the secret is shown."""
        return self._client._request(mint_call(name=name, policy=policy, budget_usd=budget_usd))

    def list(self) -> ObjectList[ChildKey]:
        """Child keys of this run (secrets are never included)."""
        return self._client._request(list_call())

    def revoke(self, key_id: str) -> ChildKey:
        """Revoke a child key at once; returns it with its new status."""
        return self._client._request(revoke_call(key_id))


class AsyncKeys(AsyncResource):
    async def mint(
        self, *, name: str | None = None, policy: dict[str, Any] | None = None, budget_usd: float | None = None
    ) -> ChildKey:
        return await self._client._request(mint_call(name=name, policy=policy, budget_usd=budget_usd))

    async def list(self) -> ObjectList[ChildKey]:
        return await self._client._request(list_call())

    async def revoke(self, key_id: str) -> ChildKey:
        return await self._client._request(revoke_call(key_id))
