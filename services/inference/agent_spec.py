"""What the gateway knows of the agent route when it names one of the gym's own models
(services/inference/agent_models.py): the inference service answers it under ``/agent``, billed
on the run's agent-model meter (gateway/agent_model.py) at the inference prices.

Only OpenAI chat completions (and the model list) are served for a gym model; a Messages or
Responses call naming one is refused with a 422 before anything is reserved. Light: the
estimators import the service's logic only when they run."""

from __future__ import annotations

from typing import Any

from kit.errors import Unprocessable
from kit.spec import Operation, ServiceContext, ServiceSpec
from services.inference.metering import bound_nusd, bound_tokens
from services.inference.schemas import CHAT_SYNONYMS, ChatRequest
from services.inference.spec import chat_defaults
from services.rollout.anthropic import CountTokensRequest, MessagesRequest
from services.rollout.responses import ResponsesRequest
from services.training.checkpoints import CheckpointRegistry

PREFIX = "/agent"
"""Where the inference service serves the agent route for gym models (the rollout service
serves the others under the same prefix)."""


def _parsed(body: dict[str, Any], context: ServiceContext, principal: Any) -> tuple[ChatRequest, Any]:
    from services.inference.agent_models import resolve_agent_model
    from services.inference.schemas import parse_inference_request

    request = parse_inference_request(body)
    model = resolve_agent_model(context.config, CheckpointRegistry.of(context), principal.run_id, request.model)
    return request, model


def estimate_gym_agent_chat(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    request, model = _parsed(body, context, principal)
    return bound_nusd(request, model.base, context.config)


def estimate_gym_agent_chat_tokens(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    request, _ = _parsed(body, context, principal)
    return bound_tokens(request, context.config)


def refuse_dialect(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    raise Unprocessable("a gym-served agent model answers the OpenAI chat completions API only "
                        "(/agent/v1/chat/completions)", param="model")


SPEC = ServiceSpec(
    name="agent",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_gym_agent_chat,
                  tokens=estimate_gym_agent_chat_tokens, json_body=True, model_field="model", schema=ChatRequest,
                  synonyms=CHAT_SYNONYMS, defaults=chat_defaults, allows_nul=True),
        # The other dialects, as the rollout service's agent route parses them: refused for a gym model.
        Operation("POST", "/v1/messages", "messages", estimate=refuse_dialect, json_body=True, model_field="model",
                  schema=MessagesRequest, allows_nul=True),
        Operation("POST", "/v1/messages/count_tokens", "messages.count_tokens", estimate=refuse_dialect,
                  json_body=True, model_field="model", schema=CountTokensRequest, concurrency=False,
                  allows_nul=True),
        Operation("POST", "/v1/responses", "responses", estimate=refuse_dialect, json_body=True, model_field="model",
                  schema=ResponsesRequest, allows_nul=True),
    ),
)
