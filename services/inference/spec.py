"""What the gateway knows of the inference service: its routes and the chat estimator.
Light: the estimator imports the service's logic only when it runs."""

from __future__ import annotations

from services.core.spec import Operation, ServiceSpec
from services.inference.metering import estimate_chat
from services.inference.schemas import CHAT_SYNONYMS, ChatRequest

SPEC = ServiceSpec(
    name="inference",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        # model_field None: the allowlist is checked on the *base* model of a checkpoint, by the service.
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat, json_body=True,
                  schema=ChatRequest, synonyms=CHAT_SYNONYMS),
    ),
)
