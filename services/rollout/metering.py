"""Prices of rollout calls: the reservation before, the settlement after.

Reservation = prompt tokens + max_tokens × n at catalogue prices (max_tokens defaults to a
cap when absent); the settled cost uses the provider's usage, capped by the reservation.
Prices are computed here in integer nano-USD from the catalogue rather than through
LiteLLM's global price map, so the same numbers appear in the estimate, the ledger and docs.
"""

from __future__ import annotations

from typing import Any

from services.core.config import RolloutConfig, RolloutModel
from services.core.errors import NotFound, Unprocessable
from services.core.money import token_cost_nusd
from services.core.spec import ServiceContext
from services.rollout.schemas import ChatRequest, parse_chat_request


def catalogue_model(config: RolloutConfig, name: str) -> RolloutModel:
    model = config.model(name)
    if model is None:
        raise NotFound(f"model {name!r} is not in the rollout catalogue", param="model")
    return model


def effective_max_tokens(request: ChatRequest, model: RolloutModel, config: RolloutConfig) -> int:
    cap = min(config.max_tokens_cap, model.max_output_tokens or config.max_tokens_cap)
    asked = request.requested_max_tokens()
    if asked is not None and asked > cap:
        raise Unprocessable(f"max_tokens may be at most {cap} for {model.name}", param="max_tokens")
    return asked or min(config.default_max_tokens, cap)


def count_prompt_tokens(model: RolloutModel, request: ChatRequest) -> int:
    import litellm  # heavy import, paid once on first use

    tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
    return int(litellm.token_counter(model=model.litellm_model, messages=request.message_dicts(), tools=tools))


def count_text_tokens(model: RolloutModel, text: str) -> int:
    import litellm

    return int(litellm.token_counter(model=model.litellm_model, text=text)) if text else 0


def call_cost_nusd(model: RolloutModel, prompt_tokens: int, completion_tokens: int) -> int:
    return token_cost_nusd(prompt_tokens, model.input_usd_per_mtok) + token_cost_nusd(
        completion_tokens, model.output_usd_per_mtok
    )


def estimate_chat(body: dict[str, Any], context: ServiceContext, principal: Any = None) -> int:
    """Gateway hook: worst-case cost of one chat completion."""
    config = context.config
    request = parse_chat_request(body)
    model = catalogue_model(config.rollout, request.model)
    max_tokens = effective_max_tokens(request, model, config.rollout)
    return call_cost_nusd(model, count_prompt_tokens(model, request), max_tokens * request.n)
