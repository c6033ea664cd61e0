"""What the gateway knows of the evaluation service: its routes and policy knob. Nothing is
metered per call: an evaluation job's trials create sandboxes and call the model through the
gateway with keys minted for the job, so sandbox seconds and tokens are metered where they are
spent (see services/evaluation/jobs.py). Light: no app, router, harbor or backend import."""

from __future__ import annotations

from typing import Annotated, Literal

from kit.policy_knobs import Levels, PolicyExtras
from kit.spec import Operation, ServiceSpec
from services.evaluation.schemas import JobRequest, SubmissionRequest


class EvaluationPolicy(PolicyExtras):
    detail: Annotated[Literal["full", "aggregate"],
                      Levels("the parent key sees aggregate results only", ("aggregate", "full"))] = "full"
    """What evaluation results the key may see."""


SPEC = ServiceSpec(
    name="evaluation",
    operations=(
        Operation("GET", "/v1/benchmarks", "benchmarks.list"),
        Operation("GET", "/v1/benchmarks/{name}/training-pool", "benchmarks.training_pool"),
        Operation("POST", "/v1/harnesses", "harnesses.upload", body_limit="upload"),
        Operation("GET", "/v1/harnesses", "harnesses.list"),
        # model_field None: the allowlist is checked on the *base* model of a checkpoint, by the service.
        Operation("POST", "/v1/jobs", "jobs.create", json_body=True, schema=JobRequest),
        Operation("GET", "/v1/jobs", "jobs.list"),
        Operation("GET", "/v1/jobs/{id}", "jobs.get"),
        Operation("GET", "/v1/jobs/{id}/results", "jobs.results"),
        Operation("POST", "/v1/jobs/{id}/cancel", "jobs.cancel"),
        Operation("POST", "/v1/submissions", "submissions.create", json_body=True, schema=SubmissionRequest),
        Operation("GET", "/v1/submissions", "submissions.list"),
    ),
    operator_operations=(
        Operation("POST", "/v1/operator/benchmarks", "operator.benchmarks.register"),
        Operation("POST", "/v1/operator/runs/{run_id}/score", "operator.runs.score"),
        Operation("GET", "/v1/operator/scores", "operator.scores"),
        Operation("GET", "/v1/operator/runs/{run_id}/submissions", "operator.runs.submissions"),
        Operation("POST", "/v1/operator/runs/{run_id}/end", "operator.runs.end"),
    ),
    policy=EvaluationPolicy,
)
