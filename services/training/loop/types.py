"""The plain values the engine takes and returns (no torch): what Tinker's wire types carry.

Defaults are copied from the SDK (tinker 0.38.0, ``tinker/types/optimizer.py`` ``AdamParams``,
``types/_pydantic_types/sampling_params.py`` ``SamplingParams``, ``types/stop_reason.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

StopReason = Literal["stop", "length"]


@dataclass
class Datum:
    """One sequence: ``tokens`` is the model input (text chunks flattened to ids);
    ``loss_fn_inputs`` the loss's per-position tensors, each as long as ``tokens`` — position ``i``
    predicts ``target_tokens[i]`` (the caller shifts the sequence by one, as Tinker documents)."""

    tokens: list[int]
    loss_fn_inputs: dict[str, list[float] | list[int]] = field(default_factory=dict)


@dataclass
class ForwardResult:
    """One output per datum (``{"logprobs": [...]}``: log p(target_tokens[i]) at each position)
    and metrics named ``name:reduction`` as the SDK reduces them (``loss:sum``)."""

    loss_fn_outputs: list[dict[str, list[float]]]
    metrics: dict[str, float]


@dataclass
class AdamParams:
    """One optimizer step's hyperparameters. ``weight_decay`` is decoupled (AdamW);
    ``grad_clip_norm`` 0 means no clipping."""

    learning_rate: float = 0.0001
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass
class SamplingParams:
    """``max_tokens`` None: until the context is full. ``stop`` None: stop at end-of-sequence;
    ``[]``: never stop early; token ids or strings (a string as one stop string). ``top_k`` -1 and
    ``top_p`` 1: no truncation; ``temperature`` 0: greedy. ``seed``: this request's own draw
    (without one the session's sampling RNG advances)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[int] | list[str] | str | None = None
    seed: int | None = None


@dataclass
class SampledSequence:
    """The generated tokens (a stop token included, as Tinker returns it), their log-probabilities
    under the model (see ``sampling``) and why generation ended."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason


@dataclass
class Meter:
    """Tokens the session processed, by kind (for metering): forward-only, forward+backward,
    sampling prompts (per sample) and sampled tokens."""

    forward: int = 0
    train: int = 0
    prefill: int = 0
    sampled: int = 0

    def total(self) -> int:
        return self.forward + self.train + self.prefill + self.sampled
