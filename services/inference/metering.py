"""Inference reservations: a bound on prompt tokens that needs no tokenizer at the gateway.

Every served tokenizer is byte-level BPE, so a rendered prompt has at most as many tokens as
it has UTF-8 bytes: reservation = bytes × prefill price + max_tokens × n × sample price. The
settlement uses the exact token counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from billing.money import token_cost_nusd
from kit.spec import ServiceContext
from services.training.checkpoints import CheckpointRegistry

if TYPE_CHECKING:
    from kit.config import BaseModel_, GymConfig
    from services.inference.schemas import ChatRequest


def bound_nusd(request: ChatRequest, base: BaseModel_, config: GymConfig) -> int:
    """The most a chat on ``base`` can cost: its prompt's bytes prefilled and ``max_tokens``
    sampled, once per choice."""
    from services.inference.service import max_tokens_of, prompt_of

    prompt_bound = len(prompt_of(request).encode("utf-8"))
    max_tokens = max_tokens_of(request, config)
    return token_cost_nusd(prompt_bound * request.n, base.prefill_usd_per_mtok) + token_cost_nusd(
        max_tokens * request.n, base.sample_usd_per_mtok)


def bound_tokens(request: ChatRequest, config: GymConfig) -> int:
    """The most tokens a chat can count (prompt bytes + ``max_tokens``, per choice)."""
    from services.inference.service import max_tokens_of, prompt_of

    return request.n * (len(prompt_of(request).encode("utf-8")) + max_tokens_of(request, config))


def estimate_chat(body: dict[str, Any], context: ServiceContext, principal: Any) -> int:
    # Imported here: the gateway imports this module (through inference/spec.py) without the service.
    from services.inference.service import parse_inference_request, resolve_model

    request = parse_inference_request(body)
    base, _ = resolve_model(context.config, CheckpointRegistry.of(context), request.model, principal.run_id,
                            principal.service_policies("inference"))
    return bound_nusd(request, base, context.config)
