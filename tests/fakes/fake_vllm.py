"""A stand-in vLLM OpenAI-compatible server for tests, answering with the REAL local engine.

It speaks the endpoints the gym's vLLM engine uses — ``GET /v1/models``, ``POST /tokenize``,
``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter`` and ``POST /v1/completions``
(plain and SSE-streamed, with ``stream_options.include_usage``) — with vLLM's status codes and
error shapes: loading a name that is already loaded is a 400, unloading or naming an unknown
adapter a 404, a missing adapter directory a 404. Generation goes through
:class:`services.inference.backends.local.LocalEngine` on the same base model, so an answer
through the vLLM path must equal the local engine's answer for the same adapter.

Every load, unload and completion is recorded for assertions (``app.state.vllm``).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from kit.config import BaseModel_
from services.inference.backends.base import Adapter, Sampling
from services.inference.backends.local import LocalEngine


@dataclass
class FakeVLLMState:
    engine: LocalEngine
    base: BaseModel_
    served_name: str
    adapters: dict[str, str] = field(default_factory=dict)  # lora_name -> lora_path, as the server holds them
    loads: list[tuple[str, str]] = field(default_factory=list)
    unloads: list[str] = field(default_factory=list)
    completions: list[dict[str, Any]] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)  # completions that named an adapter not loaded
    lock: threading.Lock = field(default_factory=threading.Lock)

    def forget_all(self) -> None:
        """What a restarted server knows: no adapters (the records stay)."""
        with self.lock:
            self.adapters.clear()


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": kind, "param": None, "code": status},
                        status_code=status)


def create_fake_vllm(engine: LocalEngine, base: BaseModel_, served_name: str | None = None) -> FastAPI:
    app = FastAPI()
    state = FakeVLLMState(engine, base, served_name or base.name)
    app.state.vllm = state

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        with state.lock:
            loras = list(state.adapters)
        data = [{"id": state.served_name, "object": "model", "owned_by": "vllm", "root": state.served_name, "parent": None}]
        data += [{"id": name, "object": "model", "owned_by": "vllm", "root": state.adapters.get(name, ""),
                  "parent": state.served_name} for name in loras]
        return {"object": "list", "data": data}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        body = await request.json()
        if body.get("model") not in (None, state.served_name) and body.get("model") not in state.adapters:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        tok = state.engine.tokenizer(state.base)
        ids = tok.encode(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True)))
        return {"count": len(ids), "max_model_len": state.base.max_context, "tokens": ids}

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request) -> Any:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.")
        with state.lock:
            if name in state.adapters:
                return _error(400, f"The lora adapter '{name}' has already been loaded.")
            if not (Path(path) / "adapter_config.json").exists():
                return _error(404, f"No adapter found for {path}", "NotFoundError")
            state.adapters[name] = path
            state.loads.append((name, path))
        return JSONResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request) -> Any:
        body = await request.json()
        name = body.get("lora_name")
        with state.lock:
            if name not in state.adapters:
                return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            del state.adapters[name]
            state.unloads.append(name)
        return JSONResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        model = body.get("model")
        with state.lock:
            path = state.adapters.get(model)
            state.completions.append(body)
        if model != state.served_name and path is None:
            with state.lock:
                state.misses.append(model)
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        adapter = Adapter(model, path) if path is not None else None
        stop = body.get("stop") or []
        sampling = Sampling(max_tokens=int(body.get("max_tokens") or 16),
                            temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                            stop=[stop] if isinstance(stop, str) else list(stop), seed=body.get("seed"),
                            min_tokens=int(body.get("min_tokens") or 0))
        prompt = body["prompt"]
        created = 0
        if not body.get("stream"):
            import anyio

            gen = await anyio.to_thread.run_sync(state.engine.generate, state.base, adapter, prompt, sampling)
            prompt_tokens = state.engine.prompt_tokens(state.base, prompt)
            return {"id": "cmpl-fake", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": gen.text, "logprobs": None, "finish_reason": gen.finish_reason}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": gen.completion_tokens,
                              "total_tokens": prompt_tokens + gen.completion_tokens}}
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(_stream(state, adapter, prompt, sampling, model, include_usage),
                                 media_type="text/event-stream")

    return app


def _stream(state: FakeVLLMState, adapter: Adapter | None, prompt: str, sampling: Sampling, model: str,
            include_usage: bool) -> Iterator[str]:
    """Pieces leave as the local engine decodes them (a worker thread feeds a queue)."""
    pieces: queue.Queue[tuple[str, Any]] = queue.Queue()

    def work() -> None:
        try:
            gen = state.engine.generate(state.base, adapter, prompt, sampling, lambda p: pieces.put(("text", p)))
            pieces.put(("done", gen))
        except Exception as err:  # reported in-stream, as vLLM does
            pieces.put(("error", err))

    threading.Thread(target=work, daemon=True).start()

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return "data: " + json.dumps({"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": model,
                                      "choices": choices, **extra}) + "\n\n"

    while True:
        kind, value = pieces.get()
        if kind == "text":
            yield event([{"index": 0, "text": value, "logprobs": None, "finish_reason": None}])
        elif kind == "error":
            yield "data: " + json.dumps({"error": {"message": str(value), "type": "InternalServerError", "code": 500}}) + "\n\n"
            break
        else:
            yield event([{"index": 0, "text": "", "logprobs": None, "finish_reason": value.finish_reason}])
            if include_usage:
                prompt_tokens = state.engine.prompt_tokens(state.base, prompt)
                yield event([], usage={"prompt_tokens": prompt_tokens, "completion_tokens": value.completion_tokens,
                                       "total_tokens": prompt_tokens + value.completion_tokens})
            break
    yield "data: [DONE]\n\n"
