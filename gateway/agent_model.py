"""The research agent's own model through the gym: ``/agent/v1/chat/completions`` (OpenAI),
``/agent/v1/messages`` (Anthropic) and ``/agent/v1/models``.

Any key of a run may call it (the run key or a child). The call goes through the gateway's
ordinary forwarding (gateway/proxy.py: policy, reservation, signed forward, settlement) with
two differences: the rollout service serves it (services/rollout/agent.py, the ``agent_models``
catalogue), and it is billed on the run's agent-model meter (billing/agent_meter.py), not
on the run's service budget. So the agent's container needs no provider credential at all.

Its token rate is the *caller's*: ``services.agent.tokens_per_minute`` on the run key (a task's
``tokens_per_minute.agent``) and its children, counted apart from rollout's
(billing/rate_limits.py); a call over it is a 429 before anything is reserved.
``/agent/v1/messages/count_tokens`` is free and unlimited: it answers the prompt bound the
reservation counts (services/rollout/agent_spec.py).
"""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response

from access.keys import Principal
from billing import agent_meter
from gateway.context import Gateway, gateway_of
from gateway.proxy import BilledRoute, forward
from kit.errors import NotFound, PermissionDenied
from services.rollout.agent_spec import PREFIX, SPEC

router = APIRouter()


async def payer(gw: Gateway, caller: Principal) -> Principal:
    found = await gw.store.call(partial(agent_meter.payer_of, gw.store, caller))
    if found is None:
        raise PermissionDenied("this run has no agent-model budget: the operator gives one when creating the run key "
                               "(rsigym keys create … --agent-budget USD)")
    return found


ROUTE = BilledRoute(spec=SPEC, served_by="rollout", prefix=PREFIX, payer=payer)


@router.api_route("/agent/{path:path}", methods=["GET", "POST"], include_in_schema=False)
async def agent_model(path: str, request: Request) -> Response:
    if ROUTE.served_by not in gateway_of(request).links:
        raise NotFound("the agent route needs the rollout service, which is not part of this gym")
    return await forward(request, agent_meter.SERVICE, path, ROUTE)
