"""Builds the rollout service app (its operations are declared in spec.py)."""

from __future__ import annotations

import logging

from fastapi import FastAPI

from kit.config import missing_provider_keys
from kit.service_app import create_service_app
from kit.spec import ServiceContext
from services.rollout import agent
from services.rollout.api import chat_completions, router
from services.rollout.backends import ROLLOUT_BACKENDS
from services.rollout.backends.base import RolloutBackend
from services.rollout.service import RolloutService
from services.rollout.spec import SPEC

__all__ = ["SPEC", "create_app"]


log = logging.getLogger("rsigym.rollout")


def create_app(context: ServiceContext, *, backend: RolloutBackend | None = None) -> FastAPI:
    for line in missing_provider_keys(context.config, context.secrets.environ):
        log.warning(line)
    backend = backend or ROLLOUT_BACKENDS.get(context.config.rollout.backend)(context)
    return create_service_app("rollout", internal_secret=context.internal_secret, routers=[router, agent.router],
                              config=context.config, close=getattr(backend, "close", None),
                              direct={("POST", "/v1/chat/completions"): chat_completions},
                              state={"rollout": RolloutService(context.config, backend),
                                     "agent": agent.AgentModelService(context.config, backend, context.store)})
