"""What the gateway knows of the inference service: its routes, the chat estimator and its
policy knob. Light: the estimator imports the service's logic only when it runs."""

from __future__ import annotations

from typing import Annotated, Any

from kit.config import GymConfig
from kit.policy_knobs import PlatformGranted, PolicyExtras
from kit.spec import Operation, ServiceSpec
from services.inference.metering import estimate_chat
from services.inference.schemas import CHAT_SYNONYMS, ChatRequest


class InferencePolicy(PolicyExtras):
    cross_run: Annotated[bool, PlatformGranted("cross-run model access is granted by the platform only")] = False
    """May use another run's checkpoints named explicitly in ``models`` — the platform's scoring
    keys only (an operator scores a run's submission on the operator's budget). Like the sandbox's
    ``door``, never passed from parent to child by anyone but the platform."""


def chat_defaults(body: dict[str, Any], config: GymConfig) -> dict[str, Any]:
    """What a chat that leaves these out runs with (services/inference/service.py)."""
    return {"max_tokens": config.inference.default_max_tokens, "temperature": 1.0, "top_p": 1.0}


SPEC = ServiceSpec(
    name="inference",
    operations=(
        Operation("GET", "/v1/models", "models.list"),
        # model_field None: the allowlist is checked on the *base* model of a checkpoint, by the service.
        Operation("POST", "/v1/chat/completions", "chat.completions", estimate=estimate_chat, json_body=True,
                  schema=ChatRequest, synonyms=CHAT_SYNONYMS, defaults=chat_defaults, allows_nul=True),
    ),
    policy=InferencePolicy,
)
