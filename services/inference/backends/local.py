"""Local inference with transformers + peft: adapters hot-loaded per request into an LRU.

Each base model is loaded once and wrapped in one ``PeftModel``; a request names its
adapter by checkpoint id (a new id for every version, so a stale adapter can never answer for
a newer one), the adapter is loaded on first use and evicted least-recently-used. Generation
holds the base model's lock: adapters are switched, never mixed, within one forward pass.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.core.config import BaseModel_
from services.inference.backends.base import Adapter, Generation, Sampling
from services.models.chat_format import IM_END
from services.models.loading import load_model, load_tokenizer, resolve_model_dir, torch_device


class _Loaded:
    def __init__(self, model: Any, tokenizer: Any):
        self.model = model  # becomes a PeftModel once the first adapter is loaded
        self.tokenizer = tokenizer
        self.lock = threading.Lock()
        self.adapters: OrderedDict[str, str] = OrderedDict()
        self.end_ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)}


def _cache_argument(model: Any) -> str:
    """The name under which the model takes and returns its KV cache: ``cache`` in recent
    transformers (``past_key_values`` is deprecated there and goes in 5.40), else
    ``past_key_values``."""
    import inspect

    forward = model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


class LocalEngine:
    def __init__(self, models_dir: Path, max_adapters: int = 8):
        self.models_dir = models_dir
        self.max_adapters = max_adapters
        self.device = torch_device()
        self._loaded: dict[str, _Loaded] = {}
        self._load_lock = threading.Lock()

    def _base(self, base: BaseModel_) -> _Loaded:
        with self._load_lock:
            if base.name not in self._loaded:
                path = str(resolve_model_dir(base, self.models_dir))
                model = load_model(path, self.device)
                model.eval()
                self._loaded[base.name] = _Loaded(model, load_tokenizer(path))
            return self._loaded[base.name]

    def tokenizer(self, base: BaseModel_) -> Any:
        return self._base(base).tokenizer

    def prompt_tokens(self, base: BaseModel_, prompt: str) -> int:
        return len(self._base(base).tokenizer.encode(prompt, add_special_tokens=False))

    def _activate(self, loaded: _Loaded, adapter: Adapter) -> None:
        from peft import PeftModel

        if adapter.key in loaded.adapters:
            loaded.adapters.move_to_end(adapter.key)
        else:
            if not isinstance(loaded.model, PeftModel):
                loaded.model = PeftModel.from_pretrained(loaded.model, adapter.path, adapter_name=adapter.key)
            else:
                loaded.model.load_adapter(adapter.path, adapter_name=adapter.key)
            loaded.adapters[adapter.key] = adapter.path
            while len(loaded.adapters) > self.max_adapters:
                evicted, _ = loaded.adapters.popitem(last=False)
                loaded.model.delete_adapter(evicted)
            loaded.model.eval()
        loaded.model.set_adapter(adapter.key)

    def loaded_adapters(self, base: BaseModel_) -> list[str]:
        return list(self._base(base).adapters)

    def generate(self, base: BaseModel_, adapter: Adapter | None, prompt: str, sampling: Sampling,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        import contextlib

        import torch

        loaded = self._base(base)
        tok = loaded.tokenizer
        ids = tok.encode(prompt, add_special_tokens=False)
        room = base.max_context - len(ids)
        if room <= 0:
            return Generation("", 0, "length")
        max_new = min(sampling.max_tokens, room)
        with loaded.lock, torch.no_grad():
            if adapter is not None:
                self._activate(loaded, adapter)
                scope: Any = contextlib.nullcontext()
            else:
                disable = getattr(loaded.model, "disable_adapter", None)
                scope = disable() if disable and loaded.adapters else contextlib.nullcontext()
            generator = torch.Generator(device=self.device)
            if sampling.seed is not None:
                generator.manual_seed(sampling.seed)
            else:
                generator.seed()
            out_ids: list[int] = []
            text, finish = "", "length"
            with scope:
                past, step_input = None, torch.tensor([ids], device=self.device)
                cache_arg = _cache_argument(loaded.model)
                for _ in range(max_new):
                    if sampling.cancelled.is_set():  # the caller went away: free the model now
                        finish = "cancelled"
                        break
                    out = loaded.model(input_ids=step_input, use_cache=True, **{cache_arg: past})
                    past = out[cache_arg] if cache_arg in out else out.past_key_values
                    logits = out.logits[0, -1].float()
                    token = self._pick(logits, sampling, generator)
                    if token in loaded.end_ids:
                        finish = "stop"
                        break
                    out_ids.append(token)
                    new_text = tok.decode(out_ids, skip_special_tokens=False)
                    piece, text = new_text[len(text):], new_text
                    hit = next((s for s in sampling.stop if s and s in text), None)
                    if hit is not None:
                        cut = text.index(hit)
                        piece = piece[: max(0, len(piece) - (len(text) - cut))]
                        text, finish = text[:cut], "stop"
                        if on_text and piece:
                            on_text(piece)
                        break
                    if on_text and piece:
                        on_text(piece)
                    step_input = torch.tensor([[token]], device=self.device)
        return Generation(text, len(out_ids), finish)

    @staticmethod
    def _pick(logits: Any, sampling: Sampling, generator: Any) -> int:
        import torch

        if sampling.temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / sampling.temperature, dim=-1)
        if sampling.top_p < 1.0:
            ordered, index = torch.sort(probs, descending=True)
            keep = torch.cumsum(ordered, dim=-1) - ordered < sampling.top_p
            ordered = ordered * keep
            probs = torch.zeros_like(probs).scatter(0, index, ordered)
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=generator))
