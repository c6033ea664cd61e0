"""Builds the rollout service app and declares its operations to the gateway."""

from __future__ import annotations

from fastapi import FastAPI

from services.core.config import GymConfig
from services.core.service_app import create_service_app
from services.core.settings import ProviderSecrets
from services.core.spec import Operation, ServiceSpec
from services.rollout.api import router
from services.rollout.backends.base import RolloutBackend
from services.rollout.backends.litellm_backend import LiteLLMBackend
from services.rollout.metering import estimate_chat
from services.rollout.service import RolloutService

SPEC = ServiceSpec(
    name="rollout",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat, json_body=True, model_field="model"),
    ),
)


def create_app(
    config: GymConfig,
    *,
    internal_secret: str,
    secrets: ProviderSecrets | None = None,
    backend: RolloutBackend | None = None,
) -> FastAPI:
    app = create_service_app("rollout", internal_secret=internal_secret, routers=[router])
    app.state.rollout = RolloutService(config, backend or LiteLLMBackend(config.rollout, secrets or ProviderSecrets()))
    return app
