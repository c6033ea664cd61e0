"""What the gateway knows of the training service: its routes (and that none is metered per
call — a job meters itself step by step). Light: no app, router, torch or backend import."""

from __future__ import annotations

from kit.spec import Operation, ServiceSpec
from services.training.schemas import JobRequest

SPEC = ServiceSpec(
    name="training",
    operations=(
        Operation("POST", "/v1/datasets", "datasets.upload", body_limit="upload"),
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
    operator_operations=(
        Operation("POST", "/v1/operator/runs/{run_id}/end", "operator.runs.end"),
    ),
)
