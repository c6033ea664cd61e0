"""What the gateway knows of the agent route (``/agent/v1/…``): its operations and their
estimators over the ``agent_models`` catalogue. Served by the rollout service under
``/agent`` (services/rollout/agent.py); billed on the run's agent-model meter
(gateway/agent_model.py). Light: LiteLLM's Anthropic adapter and Responses bridge are imported
only when a Messages or Responses request is estimated."""

from __future__ import annotations

from typing import Any

from kit.config import RolloutConfig, RolloutModel
from kit.errors import PermissionDenied
from kit.spec import Operation, ServiceContext, ServiceSpec
from services.rollout.anthropic import CountTokensRequest, MessagesRequest, count_tokens_chat_body
from services.rollout.metering import effective_max_tokens, prompt_bound_tokens, reservation_nusd
from services.rollout.responses import RESPONSES_SYNONYMS, ResponsesRequest
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest, parse_chat_request

PREFIX = "/agent"
"""Where the rollout service serves the agent route (and the gateway exposes it)."""

NAME = "agent"


def _agent_model(context: ServiceContext, name: str) -> RolloutModel:
    model = context.config.agent_catalogue().model(name)
    if model is None:
        raise PermissionDenied(f"model {name!r} is not one of this gym's agent models", param="model")
    return model


def _chat(body: dict[str, Any], context: ServiceContext) -> tuple[ChatRequest, RolloutModel, int]:
    request = parse_chat_request(body)
    model = _agent_model(context, request.model)
    return request, model, effective_max_tokens(request, model, context.config.agent_catalogue())


def estimate_agent_chat(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    request, model, max_tokens = _chat(body, context)
    return reservation_nusd(model, request, max_tokens)


def estimate_agent_chat_tokens(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    request, model, max_tokens = _chat(body, context)
    return request.n * (prompt_bound_tokens(model, request) + max_tokens)


def _as_chat(body: dict[str, Any]) -> dict[str, Any]:
    from services.rollout.anthropic import to_chat_body

    return to_chat_body(body)


def estimate_agent_messages(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    """The bound of the very chat request the Messages request is translated into."""
    return estimate_agent_chat(_as_chat(body), context)


def estimate_agent_messages_tokens(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    return estimate_agent_chat_tokens(_as_chat(body), context)


def _responses_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    from services.rollout.responses import to_chat_body

    return to_chat_body(body)


def estimate_agent_responses(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    """The bound of the very chat request the Responses request is translated into."""
    return estimate_agent_chat(_responses_as_chat(body), context)


def estimate_agent_responses_tokens(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    return estimate_agent_chat_tokens(_responses_as_chat(body), context)


def count_messages_tokens(body: dict[str, Any], catalogue: RolloutConfig) -> int:
    """``/v1/messages/count_tokens``: the input tokens of a Messages request as the route's
    reservations and token-rate limits count them — the prompt bound of the very chat request it
    is translated into (services/rollout/metering.py), so a call's reservation is this plus
    ``max_tokens``. An upper bound of what the provider bills, never below it."""
    request = parse_chat_request(count_tokens_chat_body(body))
    model = catalogue.model(request.model)
    if model is None:
        raise PermissionDenied(f"model {request.model!r} is not one of this gym's agent models", param="model")
    return prompt_bound_tokens(model, request)


SPEC = ServiceSpec(
    name=NAME,
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_agent_chat,
                  tokens=estimate_agent_chat_tokens, json_body=True, model_field="model", schema=ChatRequest,
                  synonyms=CHAT_SYNONYMS, allows_nul=True),
        Operation("POST", "/v1/messages", "messages", estimate=estimate_agent_messages,
                  tokens=estimate_agent_messages_tokens, json_body=True, model_field="model",
                  schema=MessagesRequest, allows_nul=True),
        Operation("POST", "/v1/responses", "responses", estimate=estimate_agent_responses,
                  tokens=estimate_agent_responses_tokens, json_body=True, model_field="model",
                  schema=ResponsesRequest, synonyms=RESPONSES_SYNONYMS, allows_nul=True),
        # Free and not token-limited: it only counts (the rollout service answers it).
        Operation("POST", "/v1/messages/count_tokens", "messages.count_tokens", json_body=True,
                  model_field="model", schema=CountTokensRequest, concurrency=False, allows_nul=True),
    ),
)
