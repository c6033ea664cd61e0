"""Builds the inference service app (its operations are declared in spec.py)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from billing.ledger import Ledger
from kit.config import BaseModel_
from kit.errors import ServiceUnavailable
from kit.service_app import create_service_app
from kit.spec import ServiceContext
from services.inference import agent
from services.inference.api import router
from services.inference.backends import ENGINES
from services.inference.backends.base import Adapter, Generation, InferenceEngine, Sampling
from services.inference.service import InferenceService
from services.inference.spec import SPEC
from services.training.checkpoints import CheckpointRegistry

__all__ = ["SPEC", "EngineByBackend", "create_app", "default_engines"]


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

    def close(self) -> None:
        for engine in self.engines.values():
            if (close := getattr(engine, "close", None)) is not None:
                close()


def default_engines(context: ServiceContext) -> dict[str, InferenceEngine]:
    """One engine per backend the configured base models use (local always: tests and demos
    name the tiny model)."""
    backends = {"local"} | {m.backend for m in context.config.models}
    return {name: ENGINES.get(name)(context) for name in sorted(backends)}


def create_app(context: ServiceContext, *, engine: InferenceEngine | None = None) -> FastAPI:
    engine = engine or EngineByBackend(default_engines(context))
    service = InferenceService(context.config, CheckpointRegistry.of(context), engine,
                               ledger=Ledger(context.store, context.config.ledger))
    return create_service_app("inference", internal_secret=context.internal_secret, routers=[router, agent.router],
                              config=context.config,
                              state={"inference": service, "agent": agent.AgentInference(context.config, service)},
                              close=getattr(engine, "close", None))
