"""Builds the evaluation service app and declares its agent operations to the gateway.

Nothing here is metered per call: an evaluation job's trials create sandboxes and call the
model through the gateway with keys minted for the job, so sandbox seconds and tokens are
metered where they are spent (see services/evaluation/jobs.py)."""

from __future__ import annotations

from fastapi import FastAPI

from services.core.service_app import create_service_app
from services.core.spec import Operation, ServiceContext, ServiceSpec
from services.evaluation.api import router
from services.evaluation.service import EvaluationService, JobRequest, SubmissionRequest

SPEC = ServiceSpec(
    name="evaluation",
    operations=(
        Operation("GET", "/v1/benchmarks", "benchmarks.list"),
        Operation("POST", "/v1/harnesses", "harnesses.upload"),
        Operation("GET", "/v1/harnesses", "harnesses.list"),
        Operation("POST", "/v1/jobs", "jobs.create", json_body=True, model_field="model", schema=JobRequest),
        Operation("GET", "/v1/jobs", "jobs.list"),
        Operation("GET", "/v1/jobs/{id}", "jobs.get"),
        Operation("GET", "/v1/jobs/{id}/results", "jobs.results"),
        Operation("POST", "/v1/jobs/{id}/cancel", "jobs.cancel"),
        Operation("POST", "/v1/submissions", "submissions.create", json_body=True, schema=SubmissionRequest),
        Operation("GET", "/v1/submissions", "submissions.list"),
    ),
)


def create_app(context: ServiceContext) -> FastAPI:
    app = create_service_app("evaluation", internal_secret=context.internal_secret, routers=[router])
    service = EvaluationService(context)
    app.state.evaluation = service
    app.state.close = service.shutdown
    service.runner.recover()
    return app
