"""Builds the evaluation service app (its operations are declared in spec.py)."""

from __future__ import annotations

from fastapi import FastAPI

from kit.service_app import create_service_app
from kit.spec import ServiceContext
from services.evaluation.api import router
from services.evaluation.service import EvaluationService
from services.evaluation.spec import SPEC

__all__ = ["SPEC", "create_app"]


def create_app(context: ServiceContext) -> FastAPI:
    service = EvaluationService(context)
    app = create_service_app("evaluation", internal_secret=context.internal_secret, routers=[router],
                             config=context.config, state={"evaluation": service}, close=service.shutdown)
    service.runner.recover()
    return app
