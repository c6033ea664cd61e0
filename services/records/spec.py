"""What the gateway knows of the records service: its routes. Nothing is metered per call:
reading the run's record and writing annotations cost nothing (the platform writes events
itself, in the transactions of the actions they record). Light: no app or router import."""

from __future__ import annotations

from kit.spec import Operation, ServiceSpec
from services.records.schemas import AnnotationEnvelope, ExperimentRequest

SPEC = ServiceSpec(
    name="records",
    operations=(
        Operation("GET", "/v1/events", "events.list"),
        Operation("GET", "/v1/experiments", "experiments.list"),
        Operation("POST", "/v1/experiments", "experiments.create", json_body=True, schema=ExperimentRequest),
        Operation("GET", "/v1/experiments/{id}", "experiments.get"),
        Operation("GET", "/v1/experiments/{a}/diff/{b}", "experiments.diff"),
        Operation("GET", "/v1/checkpoints/{id}/lineage", "checkpoints.lineage"),
        Operation("GET", "/v1/best-checkpoint", "checkpoints.best"),
        Operation("POST", "/v1/annotations", "annotations.create", json_body=True, schema=AnnotationEnvelope),
        Operation("GET", "/v1/annotations", "annotations.list"),
        Operation("GET", "/v1/chain", "chain.verify"),
    ),
    operator_operations=(
        Operation("GET", "/v1/operator/runs/{run_id}/events", "operator.runs.events"),
        Operation("GET", "/v1/operator/runs/{run_id}/experiments", "operator.runs.experiments"),
        Operation("GET", "/v1/operator/runs/{run_id}/chain", "operator.runs.chain"),
        Operation("GET", "/v1/operator/audits", "operator.audits"),
        Operation("POST", "/v1/operator/runs/{run_id}/audit", "operator.runs.audit"),
    ),
)
