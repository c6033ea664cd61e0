"""Inference engines, one per base-model ``backend`` (local, vllm, tinker), through one registry.

Each factory imports its engine when called, so a gym that serves no vLLM or Tinker model
never imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kit.backends import Registry

if TYPE_CHECKING:
    from kit.spec import ServiceContext
    from services.inference.backends.base import InferenceEngine

EngineFactory = Callable[["ServiceContext"], "InferenceEngine"]
ENGINES: Registry[EngineFactory] = Registry("inference")


@ENGINES.register("local")
def make_local(context: ServiceContext) -> InferenceEngine:
    from services.inference.backends.local import LocalEngine

    return LocalEngine(context.settings.resolved_models_dir(), context.config.inference.max_loaded_adapters)


@ENGINES.register("vllm")
def make_vllm(context: ServiceContext) -> InferenceEngine:
    from services.inference.backends.vllm import VLLMEngine

    return VLLMEngine(context.config.inference.max_loaded_adapters)


@ENGINES.register("tinker")
def make_tinker(context: ServiceContext) -> InferenceEngine:
    from services.inference.backends.tinker import TinkerEngine
    from services.models.tinker_client import service_client

    return TinkerEngine(service_client(context.secrets), context.settings.resolved_models_dir())
