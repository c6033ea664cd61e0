"""What the gateway knows of the rollout service: its routes and the chat estimator (a true
upper bound of what the provider can bill, services/rollout/metering.py). Light: no app or
router import; LiteLLM's Responses bridge is imported only when a Responses request is
estimated (it is bounded as the very chat request it is translated into)."""

from __future__ import annotations

from typing import Any

from kit.config import GymConfig
from kit.spec import Operation, ServiceSpec
from services.rollout.metering import estimate_chat, estimate_chat_tokens, max_tokens_cap
from services.rollout.responses import RESPONSES_SYNONYMS, ResponsesRequest
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest


def _chat_defaults(body: dict[str, Any], config: GymConfig) -> dict[str, Any]:
    """What a chat that leaves these out runs with: the catalogue's default ``max_tokens`` under
    the model's cap (services/rollout/metering.py), and the OpenAI API's documented sampling
    defaults, which the gym then sends explicitly."""
    rollout = config.rollout
    model = rollout.model(body["model"]) if isinstance(body.get("model"), str) else None
    cap = max_tokens_cap(model, rollout) if model else rollout.max_tokens_cap
    return {"max_tokens": min(rollout.default_max_tokens, cap), "temperature": 1.0, "top_p": 1.0}


def _responses_defaults(body: dict[str, Any], config: GymConfig) -> dict[str, Any]:
    """A Responses request's cap (``max_output_tokens``, canonically ``max_tokens``) defaults as the chat's."""
    chat = _chat_defaults(body, config)
    return {"max_tokens": chat["max_tokens"], "temperature": 1.0, "top_p": 1.0}


def estimate_responses(body: dict[str, Any], context: Any, principal: Any = None) -> int:
    """The bound of the very chat request the Responses request is translated into."""
    from services.rollout.responses import to_chat_body

    return estimate_chat(to_chat_body(body), context)


def estimate_responses_tokens(body: dict[str, Any], context: Any, principal: Any = None) -> int:
    from services.rollout.responses import to_chat_body

    return estimate_chat_tokens(to_chat_body(body), context)


SPEC = ServiceSpec(
    name="rollout",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat,
                  tokens=estimate_chat_tokens, pure_estimates=True, json_body=True,
                  model_field="model", schema=ChatRequest, synonyms=CHAT_SYNONYMS, defaults=_chat_defaults,
                  allows_nul=True),
        Operation("POST", "/v1/responses", "responses", estimate=estimate_responses,
                  tokens=estimate_responses_tokens, json_body=True, model_field="model", schema=ResponsesRequest, synonyms=RESPONSES_SYNONYMS,
                  defaults=_responses_defaults, allows_nul=True),
    ),
)
