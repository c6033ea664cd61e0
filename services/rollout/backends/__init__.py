"""Rollout backends, chosen by ``[rollout] backend`` through one registry (LiteLLM today:
every frontier provider goes through it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from services.core.backends import Registry

if TYPE_CHECKING:
    from services.core.spec import ServiceContext
    from services.rollout.backends.base import RolloutBackend

RolloutFactory = Callable[["ServiceContext"], "RolloutBackend"]
ROLLOUT_BACKENDS: Registry[RolloutFactory] = Registry("rollout")


@ROLLOUT_BACKENDS.register("litellm")
def make_litellm(context: ServiceContext) -> RolloutBackend:
    from services.rollout.backends.litellm_backend import LiteLLMBackend

    return LiteLLMBackend(context.config.rollout, context.secrets)
