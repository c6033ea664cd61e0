"""What the gateway knows of the training service: its routes (and that none is metered per
call — a job meters itself step by step). Light: no app, router, torch or backend import."""

from __future__ import annotations

from kit.spec import Operation, ServiceSpec
from services.training.schemas import JobRequest

_TINKER_ROUTES = (
    ("GET", "healthz"), ("POST", "client/config"), ("POST", "client/dynamic_config"), ("POST", "telemetry"),
    ("GET", "get_server_capabilities"), ("POST", "create_session"), ("POST", "session_heartbeat"),
    ("POST", "sessions/{id}/finish"), ("POST", "create_model"), ("POST", "get_info"), ("POST", "unload_model"),
    ("POST", "forward_backward"), ("POST", "optim_step"), ("POST", "save_weights_for_sampler"),
    ("POST", "save_weights"), ("POST", "load_weights"), ("POST", "create_sampling_session"),
    ("GET", "samplers/{id}"), ("POST", "asample"), ("POST", "retrieve_future"),
)
TINKER_OPERATIONS = tuple(
    Operation(method, f"/tinker/api/v1/{route}", "tinker." + route.split("/")[0], auth="tinker_key")
    for method, route in _TINKER_ROUTES
)
"""The Tinker SDK's API (services/training/tinker_api; the gateway serves it at ``/tinker``). Not
metered by the gateway per call: a call is accepted at once and answered by a future, so the
service reserves each call's worst case itself (tokens × the base model's prices) and settles
when the work is done; the key's training policy is applied by the service to the fields each
call carries (sessions.py ``check_fields``)."""

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
        *TINKER_OPERATIONS,
    ),
    operator_operations=(
        Operation("POST", "/v1/operator/runs/{run_id}/end", "operator.runs.end"),
    ),
)
