"""Inference logic: OpenAI chat completions on base models and the run's own checkpoints."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import anyio

from access.policy import ServicePolicy
from billing.ledger import Ledger
from billing.money import nusd_to_usd, token_cost_nusd
from kit.config import BaseModel_, GymConfig
from kit.errors import NotFound, PermissionDenied, Unprocessable
from kit.http import sse
from kit.identity import COST_TRAILER_PREFIX, Identity
from services.inference.backends.base import Adapter, Generation, InferenceEngine, Sampling
from services.inference.schemas import ChatRequest, min_tokens_of, parse_inference_request
from services.models.chat_format import parse_tool_calls, render_prompt
from services.training.checkpoints import CheckpointRegistry

log = logging.getLogger("rsigym.inference")
T = TypeVar("T")
Resolver = Callable[[Any], tuple[BaseModel_, "Adapter | None"]]
"""A request's ``model`` → the base model and adapter that answer it."""


def resolve_model(config: GymConfig, checkpoints: CheckpointRegistry, name: Any, run_id: str,
                  policies: Sequence[ServicePolicy] = ()) -> tuple[BaseModel_, Adapter | None]:
    """A base model name, or one of the run's checkpoint ids; anything else is a 404.

    A platform scoring key (``cross_run`` in its inference policy) may also name another
    run's checkpoint, when its policy lists that checkpoint id explicitly."""
    if not isinstance(name, str):
        raise NotFound("model must be a model name or checkpoint id", param="model")
    base = config.base_model(name)
    if base is not None:
        return base, None
    granted = any(p.cross_run and isinstance(p.models, list) and name in p.models for p in policies)
    ckpt = checkpoints.find(name) if granted else checkpoints.usable(name, run_id)  # usable: owned, or --from's grant
    if ckpt is None:
        raise NotFound(f"model {name!r} not found", param="model")
    base = config.base_model(ckpt.base_model)
    if base is None:
        raise NotFound(f"the base model of {name} is no longer offered", param="model")
    return base, Adapter(key=ckpt.id, path=ckpt.path)


def chat_cost(base: BaseModel_, prompt_tokens: int, completion_tokens: int) -> int:
    return token_cost_nusd(prompt_tokens, base.prefill_usd_per_mtok) + token_cost_nusd(
        completion_tokens, base.sample_usd_per_mtok)


def max_tokens_of(request: ChatRequest, config: GymConfig) -> int:
    asked = request.requested_max_tokens()
    cap = config.inference.max_tokens_cap
    if asked is not None and asked > cap:
        raise Unprocessable(f"max_tokens may be at most {cap}", param="max_tokens")
    return asked or config.inference.default_max_tokens


def prompt_of(request: ChatRequest) -> str:
    tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools and request.tool_choice != "none" else None
    return render_prompt(request.message_dicts(), tools)


class InferenceService:
    def __init__(self, config: GymConfig, checkpoints: CheckpointRegistry, engine: InferenceEngine,
                 ledger: Ledger | None = None):
        self.config, self.checkpoints, self.engine = config, checkpoints, engine
        self.ledger = ledger
        """Settles a stream whose client went away, for what was generated (None: the gateway
        bills the reservation)."""
        self.limiter = anyio.CapacityLimiter(config.inference.threads)
        """This service's own worker threads (``[inference] threads``), apart from other services'."""
        self.abandoned_streams = 0
        """Streams whose reader went away: their generation was stopped and settled here."""

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    def _allowed(self, identity: Identity, base: BaseModel_, adapter: Adapter | None = None) -> bool:
        """Every key of the chain allows the base model, or names this very checkpoint (a
        key scoped to one checkpoint — an evaluation's model door — may call only it)."""
        return all(p.allows_model(base.name) or (adapter is not None and p.allows_model(adapter.key))
                   for p in identity.policies)

    def list_models(self, identity: Identity) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = [{"id": m.name, "object": "model", "owned_by": "rsigym", "kind": "base",
                 "pricing": {"prefill_usd_per_mtok": m.prefill_usd_per_mtok, "sample_usd_per_mtok": m.sample_usd_per_mtok,
                             "train_usd_per_mtok": m.train_usd_per_mtok}}
                for m in self.config.models if self._allowed(identity, m)]
        for c in self.checkpoints.rows(identity.run_id):
            data.append({"id": c.id, "object": "model", "owned_by": identity.run_id, "kind": "checkpoint",
                         "base_model": c.base_model, "step": c.step, "created": int(c.created_at.timestamp())})
        return data

    def _prepare(self, identity: Identity, body: dict[str, Any],
                 resolve: Resolver | None = None) -> tuple[ChatRequest, BaseModel_, Adapter | None, str, Sampling]:
        request = parse_inference_request(body)
        if resolve is None:
            base, adapter = resolve_model(self.config, self.checkpoints, request.model, identity.run_id,
                                          identity.policies)
            if not self._allowed(identity, base, adapter):
                raise PermissionDenied(f"base model {base.name!r} is not in this key's inference allowlist",
                                       param="model")
        else:  # the agent route (services/inference/agent.py): its own resolution and policy
            base, adapter = resolve(request.model)
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        max_tokens = max_tokens_of(request, self.config)
        sampling = Sampling(max_tokens=max_tokens,
                            temperature=1.0 if request.temperature is None else request.temperature,
                            top_p=1.0 if request.top_p is None else request.top_p, stop=stop, seed=request.seed,
                            min_tokens=min_tokens_of(body, max_tokens))
        return request, base, adapter, prompt_of(request), sampling

    def _message(self, request: ChatRequest, generation: Generation) -> tuple[dict[str, Any], str]:
        if request.tools and request.tool_choice != "none":
            content, calls = parse_tool_calls(generation.text)
            if calls:
                return {"role": "assistant", "content": content or None, "tool_calls": calls}, "tool_calls"
        return {"role": "assistant", "content": generation.text}, generation.finish_reason

    async def chat(self, identity: Identity, body: dict[str, Any],
                   resolve: Resolver | None = None) -> tuple[dict[str, Any], int]:
        """``resolve``: how the body's model is found, in place of the run's own models (the agent route's)."""
        request, base, adapter, prompt, sampling = await self._run(self._prepare, identity, body, resolve)
        prompt_tokens = await self._run(self.engine.prompt_tokens, base, prompt)
        choices, completion = [], 0
        for index in range(request.n):
            if sampling.seed is not None:
                sampling.seed += index
            generation = await self._run(self.engine.generate, base, adapter, prompt, sampling)
            completion += generation.completion_tokens
            message, finish = self._message(request, generation)
            choices.append({"index": index, "message": message, "finish_reason": finish})
        # The prompt is prefilled once per choice.
        cost = chat_cost(base, prompt_tokens * request.n, completion)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": request.model, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                          "total_tokens": prompt_tokens + completion, "cost_usd": nusd_to_usd(cost)}}, cost

    async def open_stream(self, identity: Identity, body: dict[str, Any],
                          resolve: Resolver | None = None) -> AsyncIterator[bytes]:
        request, base, adapter, prompt, sampling = await self._run(self._prepare, identity, body, resolve)
        if request.n != 1:
            raise Unprocessable("streaming supports n = 1", param="n")
        prompt_tokens = await self._run(self.engine.prompt_tokens, base, prompt)
        return self._stream(identity, request, base, adapter, prompt, sampling, prompt_tokens)

    async def _stream(self, identity: Identity, request: ChatRequest, base: BaseModel_, adapter: Adapter | None,
                      prompt: str, sampling: Sampling, prompt_tokens: int) -> AsyncIterator[bytes]:
        """The generation runs in a worker thread and hands its pieces over a queue bounded by
        ``max_tokens`` (one piece per token at most): it never waits for a slow reader while it
        holds the model. A reader that goes away sets ``sampling.cancelled``: the engine stops
        at its next token, and the stream is settled here for the tokens it generated."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue(sampling.max_tokens + 2)
        tools = bool(request.tools and request.tool_choice != "none")
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        settled = False

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": request.model,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        def on_text(piece: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, piece)

        async def run() -> Generation:
            try:
                return await self._run(self.engine.generate, base, adapter, prompt, sampling, on_text)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        task = asyncio.ensure_future(run())
        try:
            yield chunk({"role": "assistant", "content": ""})
            held = ""  # with tools, text is held back until it cannot be a tool call
            while (piece := await queue.get()) is not None:
                if tools:
                    held += piece
                    continue
                yield chunk({"content": piece})
            generation = await task
            finish = generation.finish_reason
            if tools:
                message, finish = self._message(request, generation)
                if message.get("content"):
                    yield chunk({"content": message["content"]})
                for i, call in enumerate(message.get("tool_calls") or []):
                    yield chunk({"tool_calls": [{"index": i, **call}]})
            yield chunk({}, finish)
            cost = chat_cost(base, prompt_tokens, generation.completion_tokens)
            if request.stream_options and request.stream_options.include_usage:
                yield sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": request.model,
                           "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                    "completion_tokens": generation.completion_tokens,
                                                    "total_tokens": prompt_tokens + generation.completion_tokens,
                                                    "cost_usd": nusd_to_usd(cost)}})
            settled = True  # from here the gateway settles on the trailer
            yield COST_TRAILER_PREFIX + str(cost).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            if not settled:
                with anyio.CancelScope(shield=True):
                    await self._abandoned(identity, base, prompt_tokens, sampling, task)

    async def _abandoned(self, identity: Identity, base: BaseModel_, prompt_tokens: int, sampling: Sampling,
                         task: asyncio.Future[Generation]) -> None:
        """The reader went away mid-stream: stop the generation, then settle the call's
        reservation for the tokens generated (the gateway's later settlement finds it closed)."""
        sampling.cancelled.set()
        try:
            generation = await task
        except Exception as err:  # noqa: BLE001 - the engine failed too; the gateway bills the hold
            log.warning("abandoned stream of %s: the generation failed (%s)", identity.request_id, type(err).__name__)
            return
        self.abandoned_streams += 1
        if self.ledger is not None and identity.reservation_id is not None:
            cost = chat_cost(base, prompt_tokens, generation.completion_tokens)
            await self._run(self.ledger.settle, identity.reservation_id, cost)
