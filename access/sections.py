"""The sections of a key's policy (``services.<name>``): one per service, from its spec, and the
agent route's. This is the one place a new section is registered; a new knob of an existing
section is declared in that service's spec only (kit/policy_knobs.py).

Every section holds the knobs every section has (access/policy.py) and the vocabulary's extras:
a policy is one JSON shape whatever the section, and each knob is narrowed by the rule its owner
declares. A section name not listed here is refused.
"""

from __future__ import annotations

from kit.policy_knobs import PolicyExtras
from kit.spec import ServiceSpec
from services.evaluation.spec import SPEC as EVALUATION
from services.evaluation.spec import EvaluationPolicy
from services.inference.spec import SPEC as INFERENCE
from services.inference.spec import InferencePolicy
from services.records.spec import SPEC as RECORDS
from services.records.spec import RecordsPolicy
from services.rollout.agent_spec import SPEC as AGENT
from services.rollout.spec import SPEC as ROLLOUT
from services.sandbox.spec import SPEC as SANDBOX
from services.sandbox.spec import SandboxPolicy
from services.training.spec import SPEC as TRAINING

SPECS: tuple[ServiceSpec, ...] = (ROLLOUT, TRAINING, INFERENCE, SANDBOX, EVALUATION, RECORDS, AGENT)

SECTIONS: dict[str, type[PolicyExtras]] = {spec.name: spec.policy for spec in SPECS}
"""Section name → the knobs its owner declares beyond the common ones."""

LIMITED_ONLY = frozenset({AGENT.name})
"""Sections no run key's policy grants, only limits: the agent route (the research agent's own
model, ``/agent/v1``) is granted by the run's agent-model meter (billing/agent_meter.py),
whose policy the gateway applies to the body. A run key's (or child's) ``services.agent`` sets
its ``tokens_per_minute`` on that route (billing/rate_limits.py); a parent without the
entry has no limit there, so a child (or a task narrowing its track) may add one."""


class SectionExtras(SandboxPolicy, EvaluationPolicy, InferencePolicy, RecordsPolicy):
    """Every section's declared extras in one model: a spec that declares extras (``policy=``)
    names its model here too (tests/unit/access/test_policy_knobs.py checks that none is left out)."""
