"""What the gateway knows of the records service: its routes and policy knob. Nothing is
metered per call: reading the run's record and writing annotations cost nothing (the platform
writes events itself, in the transactions of the actions they record). Light: no app or router
import."""

from __future__ import annotations

from typing import Annotated

from kit.policy_knobs import NamedSubset, PolicyExtras
from kit.spec import Operation, ServiceSpec
from services.records.schemas import AnnotationEnvelope, ExperimentRequest


class RecordsPolicy(PolicyExtras):
    owners: Annotated[list[str] | None, NamedSubset("child records owners must be a subset of the parent's")] = None
    """The keys whose experiments, events and annotations this key may read besides its own
    subtree (a reviewer names the workers it reviews; each named key's subtree is included).
    None: its own subtree only. A root key reads its whole run regardless. At mint time the
    named keys must be of the same run and readable by the parent (access/keys.py); here a
    child may name only owners its parent names."""


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
        Operation("POST", "/v1/operator/monitor", "operator.monitor"),
    ),
    policy=RecordsPolicy,
)
