"""What the gateway knows of the rollout service: its routes and the chat estimator (a true
upper bound of what the provider can bill, services/rollout/metering.py). Light: no app,
router or LiteLLM import."""

from __future__ import annotations

from typing import Any

from kit.config import GymConfig
from kit.spec import Operation, ServiceSpec
from services.rollout.metering import estimate_chat, estimate_chat_tokens
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest


def _chat_defaults(body: dict[str, Any], config: GymConfig) -> dict[str, Any]:
    """What a chat that leaves these out runs with: the catalogue's default ``max_tokens`` under
    the model's cap (services/rollout/metering.py), and the OpenAI API's documented sampling
    defaults, which the gym then sends explicitly."""
    rollout = config.rollout
    model = rollout.model(body["model"]) if isinstance(body.get("model"), str) else None
    cap = min(rollout.max_tokens_cap, (model.max_output_tokens if model else None) or rollout.max_tokens_cap)
    return {"max_tokens": min(rollout.default_max_tokens, cap), "temperature": 1.0, "top_p": 1.0}


SPEC = ServiceSpec(
    name="rollout",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat,
                  tokens=estimate_chat_tokens, pure_estimates=True, json_body=True,
                  model_field="model", schema=ChatRequest, synonyms=CHAT_SYNONYMS, defaults=_chat_defaults,
                  allows_nul=True),
    ),
)
