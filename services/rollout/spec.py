"""What the gateway knows of the rollout service: its routes and the chat estimator (a true
upper bound of what the provider can bill, services/rollout/metering.py). Light: no app,
router or LiteLLM import."""

from __future__ import annotations

from services.core.spec import Operation, ServiceSpec
from services.rollout.metering import estimate_chat, estimate_chat_tokens
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest

SPEC = ServiceSpec(
    name="rollout",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat,
                  tokens=estimate_chat_tokens, json_body=True,
                  model_field="model", schema=ChatRequest, synonyms=CHAT_SYNONYMS),
    ),
)
