"""Token sampling from a causal LM with a KV cache: temperature, top-k, top-p, stop tokens and
strings, a token budget, a seeded ``torch.Generator``.

The log-probability returned for each sampled token is the model's own (``log_softmax`` of the
raw logits, before temperature and truncation) — the same quantity ``forward`` returns as
``logprobs`` for a target, so an on-policy importance ratio is exactly 1 at temperature 1. (vLLM,
which serves Tinker-style samplers, returns these "raw" log-probabilities by default too.)

A sequence ends with ``stop`` at a stop token (kept in ``tokens``, as Tinker returns the
end-of-turn token) or once its decoded text contains a stop string (the token that completed
it kept), and with ``length`` at ``max_tokens`` or the model's context.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from kit.errors import Unprocessable
from services.training.loop.types import SampledSequence, SamplingParams, StopReason


def _stops(stop: list[int] | list[str] | str | None, eos_ids: list[int]) -> tuple[set[int], list[str]]:
    if stop is None:
        return set(eos_ids), []
    if isinstance(stop, str):
        return set(), [stop]
    ids = {s for s in stop if isinstance(s, int)}
    texts = [s for s in stop if isinstance(s, str)]
    return ids, texts


def _choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits`` [n, V]."""
    if params.temperature <= 0:
        return logits.argmax(dim=-1)
    scaled = logits / params.temperature
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(ordered, dim=-1) >= params.top_p  # mass before this token
        drop[:, 0] = False
        scaled = scaled.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def cache_argument(model: Any) -> str:
    """The name under which the model takes and returns its KV cache: ``cache`` in recent
    transformers (``past_key_values`` is deprecated there), else ``past_key_values`` (as
    services/inference/backends/local.py decides it)."""
    forward = model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def check_params(params: SamplingParams, num_samples: int) -> None:
    if num_samples < 1:
        raise Unprocessable("num_samples must be at least 1", param="num_samples")
    if params.max_tokens is not None and params.max_tokens < 1:
        raise Unprocessable("sampling_params.max_tokens must be at least 1", param="sampling_params.max_tokens")
    if not 0 < params.top_p <= 1:
        raise Unprocessable("sampling_params.top_p must be in (0, 1]", param="sampling_params.top_p")
    if params.temperature < 0:
        raise Unprocessable("sampling_params.temperature must not be negative", param="sampling_params.temperature")


def generate(model: Any, tokenizer: Any, prompt: list[int], num_samples: int, params: SamplingParams, *,
             generator: torch.Generator, eos_ids: list[int], vocab_size: int, max_positions: int,
             device: str) -> list[SampledSequence]:
    """``num_samples`` continuations of ``prompt`` (one batch, one KV cache)."""
    check_params(params, num_samples)
    if not prompt:
        raise Unprocessable("the prompt has no tokens", param="prompt")
    if any(not 0 <= t < vocab_size for t in prompt):
        raise Unprocessable(f"the prompt has a token id outside the vocabulary (0..{vocab_size - 1})",
                            param="prompt")
    room = max_positions - len(prompt)
    if room < 1:
        raise Unprocessable(f"the prompt has {len(prompt)} tokens; the model's context is {max_positions}",
                            param="prompt")
    budget = room if params.max_tokens is None else min(params.max_tokens, room)
    stop_ids, stop_texts = _stops(params.stop, eos_ids)
    tokens: list[list[int]] = [[] for _ in range(num_samples)]
    logprobs: list[list[float]] = [[] for _ in range(num_samples)]
    reasons: list[StopReason | None] = [None] * num_samples
    step_input = torch.tensor([prompt] * num_samples, dtype=torch.long, device=device)
    name = cache_argument(model)
    past: Any = None
    with torch.no_grad():
        for _ in range(budget):
            out = model(input_ids=step_input, use_cache=True, **{name: past})
            past = out[name] if name in out else out.past_key_values
            logits = out.logits[:, -1, :].float()
            chosen = _choose(logits, params, generator)
            chosen_lp = torch.log_softmax(logits, dim=-1).gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
            for i, (tok, lp) in enumerate(zip(chosen.tolist(), chosen_lp.tolist(), strict=True)):
                if reasons[i] is not None:
                    continue
                tokens[i].append(tok)
                logprobs[i].append(lp)
                if tok in stop_ids or (stop_texts and any(
                        s in tokenizer.decode(tokens[i], skip_special_tokens=False) for s in stop_texts)):
                    reasons[i] = "stop"
            if all(r is not None for r in reasons):
                break
            step_input = chosen.unsqueeze(-1)
    return [SampledSequence(t, lp, r or "length") for t, lp, r in zip(tokens, logprobs, reasons, strict=True)]
