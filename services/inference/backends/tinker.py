"""Inference through Tinker's sampling API, for checkpoints trained on Tinker.

A checkpoint trained by ``services.training.backends.tinker`` is a directory holding
``tinker.json`` with its ``tinker://…`` sampler path; the engine samples from it with
``service_client.create_sampling_client(model_path=…)``. A request for the base model samples
from ``create_sampling_client(base_model=base.tinker_base_model)``. Prompts are tokenized and
answers decoded with the base model's local tokenizer (the same one training used), so the
gym's chat format and the token counts it meters are its own.

Tinker's sampler does not stream: ``on_text`` receives the whole answer once it is decoded.
``completion_tokens`` counts every token Tinker sampled (its end-of-turn token included): that
is what the service bills for.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit.config import BaseModel_
from kit.errors import GymError, InvalidRequest, ServiceUnavailable, Unprocessable, UpstreamError, UpstreamTimeout
from services.inference.backends.base import Adapter, Generation, Sampling
from services.models.chat_format import IM_END
from services.models.loading import load_tokenizer, resolve_model_dir
from services.models.tinker_client import tinker_manifest, tinker_types

log = logging.getLogger("rsigym.inference.tinker")


def _upstream(what: str, err: Exception) -> GymError:
    name = type(err).__name__
    text = f"tinker {what} failed: {name}: {err}"
    if isinstance(err, TimeoutError) or "Timeout" in name:
        return UpstreamTimeout(text)
    if isinstance(err, ConnectionError) or "Connection" in name or "Unavailable" in name:
        return ServiceUnavailable(text)
    return UpstreamError(text)


class TinkerEngine:
    def __init__(self, client: Any, models_dir: Path, max_clients: int = 16):
        self.client = client
        self.models_dir = models_dir
        self.max_clients = max_clients
        self._samplers: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def tokenizer(self, base: BaseModel_) -> Any:
        return load_tokenizer(str(resolve_model_dir(base, self.models_dir)))

    def prompt_tokens(self, base: BaseModel_, prompt: str) -> int:
        return len(self.tokenizer(base).encode(prompt, add_special_tokens=False))

    def _target(self, base: BaseModel_, adapter: Adapter | None) -> tuple[str, dict[str, str]]:
        """The cache key and create_sampling_client arguments for a request."""
        if adapter is None:
            if not base.tinker_base_model:
                raise ServiceUnavailable(f"base model {base.name!r} is served by tinker but has no tinker_base_model configured")
            return f"base:{base.tinker_base_model}", {"base_model": base.tinker_base_model}
        try:
            manifest = tinker_manifest(adapter.path)
        except ValueError as err:
            raise UpstreamError(str(err)) from err
        if manifest is None:
            raise InvalidRequest(f"checkpoint {adapter.key} was not trained on tinker; the tinker backend cannot serve it",
                                 param="model")
        if base.tinker_base_model and manifest.get("base_model") != base.tinker_base_model:
            raise InvalidRequest(f"checkpoint {adapter.key} was trained on {manifest.get('base_model')!r}, "
                                 f"not {base.tinker_base_model!r}", param="model")
        return str(manifest["path"]), {"model_path": str(manifest["path"])}

    def _sampler(self, key: str, kwargs: dict[str, str]) -> Any:
        with self._lock:
            if key in self._samplers:
                self._samplers.move_to_end(key)
                return self._samplers[key]
        try:
            sampler = self.client.create_sampling_client(**kwargs)
        except Exception as err:
            raise _upstream(f"creating a sampling client for {key}", err) from err
        with self._lock:
            sampler = self._samplers.setdefault(key, sampler)
            self._samplers.move_to_end(key)
            while len(self._samplers) > self.max_clients:
                self._samplers.popitem(last=False)
        return sampler

    def generate(self, base: BaseModel_, adapter: Adapter | None, prompt: str, sampling: Sampling,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        if sampling.min_tokens:  # Tinker's sampler has no such parameter
            raise Unprocessable("min_tokens is not offered by the tinker backend", param="min_tokens")
        if sampling.cancelled.is_set():  # one call, not token by token: only a cancel before it counts
            return Generation("", 0, "cancelled")
        tok = self.tokenizer(base)
        ids = tok.encode(prompt, add_special_tokens=False)
        room = base.max_context - len(ids)
        if room <= 0:
            return Generation("", 0, "length")
        key, kwargs = self._target(base, adapter)
        sampler = self._sampler(key, kwargs)
        t = tinker_types()
        stops = [s for s in sampling.stop if s]
        params = t.SamplingParams(max_tokens=min(sampling.max_tokens, room), seed=sampling.seed,
                                  stop=stops or None, temperature=sampling.temperature, top_p=sampling.top_p)
        try:
            response = sampler.sample(prompt=t.ModelInput.from_ints(tokens=ids), num_samples=1,
                                      sampling_params=params).result()
        except Exception as err:
            raise _upstream(f"sampling from {key}", err) from err
        sequences = list(getattr(response, "sequences", None) or [])
        if not sequences:
            raise UpstreamError(f"tinker sampling from {key} returned no sequence")
        sequence = sequences[0]
        tokens = [int(x) for x in sequence.tokens]
        end_ids = {tok.eos_token_id, tok.convert_tokens_to_ids(IM_END)}
        cut = next((i for i, x in enumerate(tokens) if x in end_ids), None)
        finish = "stop" if cut is not None or getattr(sequence, "stop_reason", "length") == "stop" else "length"
        text = tok.decode(tokens[:cut] if cut is not None else tokens, skip_special_tokens=False)
        hit = min((text.index(s) for s in stops if s in text), default=None)
        if hit is not None:
            text, finish = text[:hit], "stop"
        if on_text and text:
            on_text(text)
        return Generation(text, len(tokens), finish)
