"""Rollout backends, chosen by ``[rollout] backend`` through one registry. ``litellm``: every
provider through LiteLLM, except OpenAI-compatible upstreams (``openai/…``), which go by a direct
HTTP pass-through (aiohttp) unless ``[rollout] openai_passthrough = false``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kit.backends import Registry

if TYPE_CHECKING:
    from kit.spec import ServiceContext
    from services.rollout.backends.base import RolloutBackend

RolloutFactory = Callable[["ServiceContext"], "RolloutBackend"]
ROLLOUT_BACKENDS: Registry[RolloutFactory] = Registry("rollout")


@ROLLOUT_BACKENDS.register("litellm")
def make_litellm(context: ServiceContext) -> RolloutBackend:
    from services.rollout.backends.litellm_backend import LiteLLMBackend
    from services.rollout.backends.openai_compatible import OpenAICompatibleBackend, RoutedBackend

    config = context.config.rollout
    litellm = LiteLLMBackend(config, context.secrets)
    if not config.openai_passthrough:
        return litellm
    return RoutedBackend(OpenAICompatibleBackend(config, context.secrets), litellm)
