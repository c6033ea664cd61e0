"""Builds the training service app (its operations are declared in spec.py)."""

from __future__ import annotations

from fastapi import FastAPI

from kit.service_app import create_service_app
from kit.spec import ServiceContext
from services.training.api import router
from services.training.service import TrainingService
from services.training.spec import SPEC
from services.training.tinker_api.router import router as tinker_router
from services.training.tinker_api.sessions import TinkerAPI

__all__ = ["SPEC", "create_app"]


def create_app(context: ServiceContext) -> FastAPI:
    service = TrainingService(context)
    tinker = TinkerAPI(context, service.registry, service.events, datasets=service.datasets)  # loop records scanned too

    def close() -> None:
        tinker.shutdown()
        service.shutdown()

    app = create_service_app("training", internal_secret=context.internal_secret, routers=[router, tinker_router],
                             config=context.config, state={"training": service, "tinker": tinker}, close=close)
    service.runner.recover()
    return app
