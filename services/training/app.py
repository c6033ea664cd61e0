"""Builds the training service app and declares its operations to the gateway.

Submitting a job is not metered at the gateway: the job meters itself step by step."""

from __future__ import annotations

from fastapi import FastAPI

from services.core.service_app import create_service_app
from services.core.spec import Operation, ServiceContext, ServiceSpec
from services.training.api import router
from services.training.schemas import JobRequest
from services.training.service import TrainingService

SPEC = ServiceSpec(
    name="training",
    operations=(
        Operation("POST", "/v1/datasets", "datasets.upload"),
        Operation("GET", "/v1/datasets", "datasets.list"),
        Operation("GET", "/v1/datasets/{id}/content", "datasets.content"),
        Operation("POST", "/v1/jobs", "jobs.create", json_body=True, model_field="base_model", schema=JobRequest),
        Operation("GET", "/v1/jobs", "jobs.list"),
        Operation("GET", "/v1/jobs/{id}", "jobs.get"),
        Operation("POST", "/v1/jobs/{id}/cancel", "jobs.cancel"),
        Operation("GET", "/v1/jobs/{id}/logs", "jobs.logs"),
        Operation("GET", "/v1/checkpoints", "checkpoints.list"),
        Operation("GET", "/v1/checkpoints/{id}", "checkpoints.get"),
    ),
)


def create_app(context: ServiceContext) -> FastAPI:
    app = create_service_app("training", internal_secret=context.internal_secret, routers=[router])
    service = TrainingService(context)
    app.state.training = service
    service.runner.recover()
    return app
