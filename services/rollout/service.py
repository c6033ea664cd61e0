"""Rollout logic: frontier (catalogue) models for agents, metered token-exactly.

The cost reported to the gateway is what the provider billed (its usage at catalogue prices,
never clamped here; the gateway clamps to the reservation and records any excess). When the
provider had the request but the gym cannot see what it billed — it timed out, broke a
stream off, or reported no usage — the call costs its reservation (``Identity.estimate_nusd``),
which is the most it could have billed. Refusals before the provider was contacted stay free.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from billing.money import nusd_to_usd
from kit.config import GymConfig, RolloutModel
from kit.errors import GymError, PermissionDenied, UpstreamTimeout
from kit.http import sse
from kit.identity import COST_HEADER, COST_TRAILER_PREFIX, Identity
from services.rollout.backends.base import RolloutBackend
from services.rollout.metering import call_cost_nusd, catalogue_model, effective_max_tokens
from services.rollout.schemas import ChatRequest, parse_chat_request

log = logging.getLogger("rsigym.rollout")

_CHOICE_KEYS = ("index", "message", "delta", "finish_reason", "logprobs")
_BILLED_FAILURES = (UpstreamTimeout,)
"""Provider failures after it had the request: it may have generated (and billed) anyway."""


def _allowed(identity: Identity, model: str) -> bool:
    return all(p.allows_model(model) for p in identity.policies)


def _clean_choice(choice: dict[str, Any]) -> dict[str, Any]:
    out = {k: choice[k] for k in _CHOICE_KEYS if k in choice}
    for part in ("message", "delta"):
        if isinstance(out.get(part), dict):
            out[part] = {k: v for k, v in out[part].items() if v is not None and k != "provider_specific_fields"}
    return out


def _usage(prompt: int, completion: int, cost_nusd: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cost_usd": nusd_to_usd(cost_nusd),
    }


def _reported(usage: dict[str, Any] | None) -> tuple[int, int] | None:
    """(prompt, completion) tokens the provider billed, or None when it did not say."""
    if not usage or usage.get("prompt_tokens") is None:
        return None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def _charged(identity: Identity, cost_nusd: int) -> int:
    """What the agent pays: the gateway charges at most the reservation (the excess is recorded
    as an overrun, never billed to the run), so the usage shown to the agent says the same."""
    return min(cost_nusd, identity.estimate_nusd) if identity.reservation_id else cost_nusd


def _billed(err: GymError, cost_nusd: int) -> GymError:
    """The error keeps its shape but carries the call's cost, so the gateway settles it, and says
    so: the provider had the request and may have billed it."""
    err.headers = {**err.headers, COST_HEADER: str(cost_nusd)}
    err.message += (f" Billed ${nusd_to_usd(cost_nusd):.6f}, the call's reservation: the provider had the request "
                    "and may have generated.")
    return err


def _unbilled(err: GymError) -> GymError:
    err.message += " Not billed."
    return err


class RolloutService:
    def __init__(self, config: GymConfig, backend: RolloutBackend):
        self.config = config
        self.backend = backend

    def list_models(self, identity: Identity) -> list[dict[str, Any]]:
        return [
            {
                "id": m.name,
                "object": "model",
                "owned_by": "rsigym-rollout",
                "pricing": {"input_usd_per_mtok": m.input_usd_per_mtok, "output_usd_per_mtok": m.output_usd_per_mtok},
            }
            for m in self.config.rollout.models
            if _allowed(identity, m.name)
        ]

    def _prepare(self, identity: Identity, body: dict[str, Any]) -> tuple[ChatRequest, RolloutModel, int]:
        request = parse_chat_request(body)
        if not _allowed(identity, request.model):
            raise PermissionDenied(f"model {request.model!r} is not in this key's rollout allowlist", param="model")
        model = catalogue_model(self.config.rollout, request.model)
        return request, model, effective_max_tokens(request, model, self.config.rollout)

    async def chat(self, identity: Identity, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Returns the OpenAI-shaped completion and its cost in nano-USD."""
        request, model, max_tokens = self._prepare(identity, body)
        try:
            raw = await self.backend.complete(model, request, max_tokens)
        except _BILLED_FAILURES as err:
            raise _billed(err, identity.estimate_nusd) from None
        except GymError as err:  # refused before or by the provider: nothing generated
            raise _unbilled(err) from None
        reported = _reported(raw.get("usage"))
        if reported is None:
            log.warning("%s: the provider reported no usage; billing the reservation", identity.request_id)
            prompt, completion, cost = 0, 0, identity.estimate_nusd
        else:
            prompt, completion = reported
            cost = call_cost_nusd(model, prompt, completion)
        return {
            "id": raw.get("id"),
            "object": "chat.completion",
            "created": raw.get("created"),
            "model": model.name,
            "choices": [_clean_choice(c) for c in raw.get("choices") or []],
            "usage": _usage(prompt, completion, _charged(identity, cost)),
        }, cost

    async def open_stream(self, identity: Identity, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Opens the provider stream now (so refusals are plain errors) and returns SSE bytes.

        The stream ends with an SSE comment carrying the exact cost for the gateway to settle.
        """
        request, model, max_tokens = self._prepare(identity, body)
        try:
            chunks = await self.backend.stream(model, request, max_tokens)
        except _BILLED_FAILURES as err:
            raise _billed(err, identity.estimate_nusd) from None
        except GymError as err:  # refused before or by the provider: nothing generated
            raise _unbilled(err) from None
        return self._relay(identity, request, model, chunks)

    async def _relay(self, identity: Identity, request: ChatRequest, model: RolloutModel,
                     chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        want_usage = bool(request.stream_options and request.stream_options.include_usage)
        usage: dict[str, Any] | None = None
        error: GymError | None = None
        try:
            async for chunk in chunks:
                if chunk.get("usage"):
                    usage = chunk["usage"]
                choices = [_clean_choice(c) for c in chunk.get("choices") or []]
                if choices:
                    yield sse({"id": chunk.get("id"), "object": "chat.completion.chunk", "created": chunk.get("created"),
                               "model": model.name, "choices": choices})
        except GymError as err:
            error = err
        reported = _reported(usage) if error is None else None
        if reported is None:  # broke off, or no usage: it may have generated more than was streamed
            log.warning("%s: the provider stream %s; billing the reservation", identity.request_id,
                        "broke off" if error is not None else "reported no usage")
            prompt, completion, cost = 0, 0, identity.estimate_nusd
        else:
            prompt, completion = reported
            cost = call_cost_nusd(model, prompt, completion)
        if error is not None:
            message = (f"{error.message} Billed ${nusd_to_usd(_charged(identity, cost)):.6f}, the call's reservation: "
                       "the stream broke off, so what the provider generated is not known.")
            yield sse({"error": {"type": error.type, "message": message, "param": error.param}})
        elif want_usage:
            yield sse({"object": "chat.completion.chunk", "model": model.name, "choices": [],
                       "usage": _usage(prompt, completion, _charged(identity, cost))})
        yield COST_TRAILER_PREFIX + str(cost).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
