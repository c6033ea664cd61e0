"""Builds the inference service app and declares its operations to the gateway."""

from __future__ import annotations

from fastapi import FastAPI

from services.core.service_app import create_service_app
from services.core.spec import Operation, ServiceContext, ServiceSpec
from services.inference.api import router
from services.inference.backends.base import InferenceEngine
from services.inference.backends.local import LocalEngine
from services.inference.metering import estimate_chat
from services.inference.service import InferenceService

SPEC = ServiceSpec(
    name="inference",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        # model_field None: the allowlist is checked on the *base* model of a checkpoint, by the service.
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat, json_body=True),
    ),
)


def create_app(context: ServiceContext, *, engine: InferenceEngine | None = None) -> FastAPI:
    app = create_service_app("inference", internal_secret=context.internal_secret, routers=[router])
    engine = engine or LocalEngine(context.settings.resolved_models_dir(), context.config.inference.max_loaded_adapters)
    app.state.inference = InferenceService(context.config, context.store, engine)
    return app
