"""Builds the inference service app and declares its operations to the gateway."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from services.core.config import BaseModel_
from services.core.errors import ServiceUnavailable

from services.core.service_app import create_service_app
from services.core.spec import Operation, ServiceContext, ServiceSpec
from services.inference.api import router
from services.inference.backends.base import Adapter, Generation, InferenceEngine, Sampling
from services.inference.backends.local import LocalEngine
from services.inference.metering import estimate_chat
from services.inference.service import InferenceService
from services.rollout.schemas import CHAT_SYNONYMS, ChatRequest

SPEC = ServiceSpec(
    name="inference",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        # model_field None: the allowlist is checked on the *base* model of a checkpoint, by the service.
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat, json_body=True,
                  schema=ChatRequest, synonyms=CHAT_SYNONYMS),
    ),
)


class EngineByBackend:
    """Routes each request to the engine of its base model's backend (local, vllm, tinker)."""

    def __init__(self, engines: dict[str, InferenceEngine]):
        self.engines = engines

    def _engine(self, base: BaseModel_) -> InferenceEngine:
        engine = self.engines.get(base.backend)
        if engine is None:
            raise ServiceUnavailable(f"no {base.backend} engine is configured for {base.name}")
        return engine

    def prompt_tokens(self, base: BaseModel_, prompt: str) -> int:
        return self._engine(base).prompt_tokens(base, prompt)

    def generate(self, base: BaseModel_, adapter: Adapter | None, prompt: str, sampling: Sampling,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        return self._engine(base).generate(base, adapter, prompt, sampling, on_text)


def default_engines(context: ServiceContext) -> dict[str, InferenceEngine]:
    models_dir, cap = context.settings.resolved_models_dir(), context.config.inference.max_loaded_adapters
    engines: dict[str, InferenceEngine] = {"local": LocalEngine(models_dir, cap)}
    backends = {m.backend for m in context.config.models}
    if "vllm" in backends:
        from services.inference.backends.vllm import VLLMEngine

        engines["vllm"] = VLLMEngine(cap)
    if "tinker" in backends:
        from services.inference.backends.tinker import TinkerEngine
        from services.training.backends.tinker import service_client

        engines["tinker"] = TinkerEngine(service_client(context.secrets), models_dir)
    return engines


def create_app(context: ServiceContext, *, engine: InferenceEngine | None = None) -> FastAPI:
    app = create_service_app("inference", internal_secret=context.internal_secret, routers=[router])
    engine = engine or EngineByBackend(default_engines(context))
    app.state.inference = InferenceService(context.config, context.store, engine)
    return app
