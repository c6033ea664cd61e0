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

A call naming one of the gym's own models (a ``gym:`` name, or an agent model ``served_by =
"gym"``: services/inference/agent_models.py) goes the same way to the inference service instead
(``GYM_ROUTE``), on the same meter, at the inference prices; so does the model list, which the
inference service answers with the whole catalogue and the run's own gym model.
"""

from __future__ import annotations

import json
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response

from access.keys import Principal
from billing import agent_meter
from gateway.context import Gateway, gateway_of
from gateway.proxy import BilledRoute, forward
from kit.config import GYM_AGENT_PREFIX, GymConfig
from kit.errors import NotFound, PermissionDenied
from services.inference.agent_spec import SPEC as GYM_SPEC
from services.rollout.agent_spec import PREFIX, SPEC

router = APIRouter()


async def payer(gw: Gateway, caller: Principal) -> Principal:
    found = await gw.store.call(partial(agent_meter.payer_of, gw.store, caller))
    if found is None:
        raise PermissionDenied("this run has no agent-model budget: the operator gives one when creating the run key "
                               "(rsigym keys create … --agent-budget USD)")
    return found


ROUTE = BilledRoute(spec=SPEC, served_by="rollout", prefix=PREFIX, payer=payer)
GYM_ROUTE = BilledRoute(spec=GYM_SPEC, served_by="inference", prefix=PREFIX, payer=payer)


def names_gym_model(config: GymConfig, raw: bytes) -> bool:
    """Whether a body's ``model`` is one of the gym's own (read only when it may be: most calls
    name a provider model and are not parsed twice)."""
    gym_names = [m.name for m in config.agent_models if m.served_by == "gym"]
    if GYM_AGENT_PREFIX.encode() not in raw and not any(n.encode() in raw for n in gym_names):
        return False
    try:
        model = json.loads(raw).get("model")
    except (ValueError, AttributeError):
        return False  # the route's own parsing answers it
    return isinstance(model, str) and (model.startswith(GYM_AGENT_PREFIX) or model in gym_names)


@router.api_route("/agent/{path:path}", methods=["GET", "POST"], include_in_schema=False)
async def agent_model(path: str, request: Request) -> Response:
    gw = gateway_of(request)
    route = ROUTE
    if GYM_ROUTE.served_by in gw.links:
        if request.method == "GET" or names_gym_model(gw.config, await request.body()):
            route = GYM_ROUTE
    if route.served_by not in gw.links:
        raise NotFound("the agent route needs the rollout service, which is not part of this gym")
    return await forward(request, agent_meter.SERVICE, path, route)
