"""Builds the rollout service app and declares its operations to the gateway."""

from __future__ import annotations

from fastapi import FastAPI

from services.core.service_app import create_service_app
from services.core.spec import Operation, ServiceContext, ServiceSpec
from services.rollout.api import router
from services.rollout.backends.base import RolloutBackend
from services.rollout.backends.litellm_backend import LiteLLMBackend
from services.rollout.metering import estimate_chat
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest
from services.rollout.service import RolloutService

SPEC = ServiceSpec(
    name="rollout",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat, json_body=True, model_field="model",
                  schema=ChatRequest, synonyms=CHAT_SYNONYMS),
    ),
)


def create_app(context: ServiceContext, *, backend: RolloutBackend | None = None) -> FastAPI:
    app = create_service_app("rollout", internal_secret=context.internal_secret, routers=[router])
    app.state.rollout = RolloutService(context.config, backend or LiteLLMBackend(context.config.rollout, context.secrets))
    return app
