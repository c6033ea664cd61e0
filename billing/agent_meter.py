"""A run's agent-model meter: the account its research agent's own model is billed on.

The benchmark reports what an agent spent on its own LLM apart from what it spent on the
gym's services, so each run may have a second budget. It is a key of its own — a root key
named ``agent-model:<run>`` whose policy grants only the ``agent`` route, whose plaintext is
never shown to anyone — linked from the run key (``api_keys.agent_meter_id``). Calls on the
agent route reserve and settle on it with the ordinary ledger (billing/ledger.py), so
it fails closed exactly like a run budget; the operator tops it up like any key
(``rsigym keys topup <meter id> USD``). A run without one is refused the agent route (403).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from access.keys import KeyRegistry, Principal
from access.policy import Policy, ServicePolicy
from billing.ledger import balance_of, chain_of
from kit.errors import NotFound, Unprocessable
from storage.store import Store
from storage.tables import ApiKey

SERVICE = "agent"


def meter_policy() -> Policy:
    return Policy(services={SERVICE: ServicePolicy()})


def attach_meter(store: Store, run_id: str, budget_nusd: int) -> dict[str, Any]:
    """Give run ``run_id`` an agent-model meter of ``budget_nusd``; returns the meter's view."""
    if budget_nusd < 0:
        raise Unprocessable("the agent-model budget must be >= 0", param="agent_budget_usd")
    view, _never_shown = KeyRegistry(store).create(policy=meter_policy(), budget_nusd=budget_nusd,
                                                   name=f"agent-model:{run_id}")
    with store.transaction() as s:
        linked = s.execute(update(ApiKey).where(ApiKey.id == run_id, ApiKey.parent_id.is_(None),
                                                ApiKey.agent_meter_id.is_(None))
                           .values(agent_meter_id=view["id"]).execution_options(synchronize_session=False))
        if getattr(linked, "rowcount", 0) != 1:
            s.execute(update(ApiKey).where(ApiKey.id == view["id"]).values(status="revoked")
                      .execution_options(synchronize_session=False))
            raise Unprocessable("only a run key without an agent-model meter can be given one", param="id")
    return view


def meter_id_of(store: Store, run_id: str) -> str | None:
    with store.transaction() as s:
        run = s.get(ApiKey, run_id)
        if run is None:
            raise NotFound(f"key {run_id} not found", param="id")
        return run.agent_meter_id


def payer_of(store: Store, caller: Principal) -> Principal | None:
    """Who pays the caller's agent-route calls: the run's meter (None: the run has none)."""
    with store.transaction() as s:
        run = s.get(ApiKey, caller.run_id)
        meter = s.get(ApiKey, run.agent_meter_id) if run is not None and run.agent_meter_id else None
        if meter is None:
            return None
        return Principal(key_id=meter.id, run_id=caller.run_id, chain_ids=(meter.id,),
                         policies=(Policy.model_validate(meter.policy),), track=None)


def meter_balance(store: Store, run_id: str) -> dict[str, float] | None:
    """The agent-model meter's {budget_usd, spent_usd, reserved_usd, remaining_usd}; None without one."""
    with store.transaction() as s:
        run = s.get(ApiKey, run_id)
        if run is None or run.agent_meter_id is None:
            return None
        return balance_of(chain_of(s, run.agent_meter_id)).as_usd()
