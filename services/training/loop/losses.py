"""Tinker's built-in loss functions, per token and summed, as the SDK's documentation defines them.

Every loss is a SUM over the positions of every datum (never a mean): Tinker's docs give
``loss = -(prob_ratio * advantages).sum()`` for ``importance_sampling``, the SDK's custom-loss
path relies on "Backend CE is L = sum(-logprobs * weights)"
(``lib/public_interfaces/training_client.py``), and the summed value comes back as the metric
``loss:sum``. With ``logp`` = log p_theta(target_tokens[i]) from this forward pass and ``q`` =
``loss_fn_inputs["logprobs"]`` (the sampler's log-probabilities):

* ``cross_entropy`` (target_tokens, weights): ``-weights * logp``. ``weights`` may be left out
  (all ones), as the SDK's own ``forward`` example does.
* ``importance_sampling`` (target_tokens, logprobs, advantages): ``-exp(logp - q) * advantages``.
* ``ppo`` (same inputs): ``-min(r * A, clip(r, low, high) * A)``, ``r = exp(logp - q)``, token-wise;
  ``loss_fn_config`` ``clip_low_threshold`` / ``clip_high_threshold`` are absolute ratio bounds,
  0.8 and 1.2 by default (tinker-cookbook tutorial 202; the docs' PPO page: epsilon 0.2).
* ``cispo`` (same inputs): ``-(clip(r, low, high).detach() * A * logp)``, defaults 0.0 and 4.0.

Unknown losses, inputs a loss does not take, missing inputs, lengths other than the datum's
and config keys a loss does not take are refused with ``Unprocessable`` naming the field (Tinker
refuses unknown input keys too: the cookbook strips its ``mask`` before sending).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from kit.errors import Unprocessable
from services.training.loop.types import Datum

Tensor = torch.Tensor
TokenLoss = Callable[[Tensor, dict[str, Tensor], dict[str, float]], Tensor]
"""(logp [B, T], inputs {name: [B, T]}, config) -> per-token loss [B, T] (padding masked after)."""


@dataclass(frozen=True)
class LossSpec:
    per_token: TokenLoss
    required: tuple[str, ...]
    optional: dict[str, float] = field(default_factory=dict)
    """Inputs that may be left out, with the value every position then takes."""
    config: dict[str, float] = field(default_factory=dict)
    """``loss_fn_config`` keys the loss takes, with their defaults."""


def _cross_entropy(logp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    return -inputs["weights"] * logp


def _importance_sampling(logp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    return -torch.exp(logp - inputs["logprobs"]) * inputs["advantages"]


def _ppo(logp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    ratio = torch.exp(logp - inputs["logprobs"])
    advantages = inputs["advantages"]
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
    return -torch.minimum(ratio * advantages, clipped * advantages)


def _cispo(logp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    ratio = torch.exp(logp - inputs["logprobs"])
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"]).detach()
    return -(clipped * inputs["advantages"] * logp)


_RL = ("target_tokens", "logprobs", "advantages")
LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(_cross_entropy, ("target_tokens",), optional={"weights": 1.0}),
    "importance_sampling": LossSpec(_importance_sampling, _RL),
    "ppo": LossSpec(_ppo, _RL, config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": LossSpec(_cispo, _RL, config={"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}),
}
INT_INPUTS = frozenset({"target_tokens"})


def loss_spec(loss_fn: str) -> LossSpec:
    spec = LOSSES.get(loss_fn)
    if spec is None:
        raise Unprocessable(f"loss_fn {loss_fn!r} is not supported here; use one of {', '.join(LOSSES)} "
                            "(or forward_backward_custom)", param="loss_fn")
    return spec


def resolve_config(loss_fn: str, spec: LossSpec, given: Mapping[str, object] | None) -> dict[str, float]:
    """The loss's config: its defaults overridden by ``given``, every key known and a finite number."""
    config = dict(spec.config)
    for key, value in (given or {}).items():
        param = f"loss_fn_config.{key}"
        if key not in spec.config:
            takes = ", ".join(spec.config) or "no config"
            raise Unprocessable(f"loss_fn {loss_fn!r} takes {takes}, not {key!r}", param=param)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise Unprocessable(f"{param} must be a finite number", param=param)
        config[key] = float(value)
    if "clip_low_threshold" in config and config["clip_low_threshold"] > config["clip_high_threshold"]:
        raise Unprocessable("clip_low_threshold must not exceed clip_high_threshold", param="loss_fn_config")
    return config


def check_datum(loss_fn: str, spec: LossSpec, datum: Datum, index: int, vocab_size: int,
                max_positions: int) -> dict[str, list[float] | list[int]]:
    """``datum``'s inputs for ``loss_fn`` (optional ones filled in), or ``Unprocessable``."""
    where = f"data[{index}]"
    n = len(datum.tokens)
    if n == 0:
        raise Unprocessable(f"{where}: model_input has no tokens", param="model_input")
    if n > max_positions:
        raise Unprocessable(f"{where}: model_input has {n} tokens; the model's context is {max_positions}",
                            param="model_input")
    if any(not 0 <= t < vocab_size for t in datum.tokens):
        raise Unprocessable(f"{where}: model_input has a token id outside the vocabulary (0..{vocab_size - 1})",
                            param="model_input")
    inputs = dict(datum.loss_fn_inputs)
    for key in inputs:
        if key not in spec.required and key not in spec.optional:
            takes = ", ".join((*spec.required, *spec.optional))
            raise Unprocessable(f"{where}: loss_fn {loss_fn!r} takes {takes}, not {key!r}",
                                param=f"loss_fn_inputs.{key}")
    for key in spec.required:
        if key not in inputs:
            raise Unprocessable(f"{where}: loss_fn {loss_fn!r} needs loss_fn_inputs[{key!r}]",
                                param=f"loss_fn_inputs.{key}")
    for key, fill in spec.optional.items():
        inputs.setdefault(key, [fill] * n)
    for key, values in inputs.items():
        param = f"loss_fn_inputs.{key}"
        if len(values) != n:
            raise Unprocessable(f"{where}: {param} has {len(values)} values; model_input has {n} tokens",
                                param=param)
        if key in INT_INPUTS:
            if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab_size for v in values):
                raise Unprocessable(f"{where}: {param} must be token ids in 0..{vocab_size - 1}", param=param)
        elif any(isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) for v in values):
            raise Unprocessable(f"{where}: {param} must be finite numbers", param=param)
    return inputs


def check_data(loss_fn: str, data: list[Datum], vocab_size: int, max_positions: int,
               ) -> tuple[LossSpec, list[dict[str, list[float] | list[int]]]]:
    spec = loss_spec(loss_fn)
    if not data:
        raise Unprocessable("data is empty", param="data")
    return spec, [check_datum(loss_fn, spec, d, i, vocab_size, max_positions) for i, d in enumerate(data)]
