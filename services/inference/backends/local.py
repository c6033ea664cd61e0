"""Local inference with transformers + peft: continuous batching per base model, adapters
hot-loaded per request into an LRU.

Each base model is loaded once and wrapped in one ``PeftModel``; a request names its adapter by
checkpoint id (a new id for every version, so a stale adapter can never answer for a newer one),
the adapter is loaded on first use and evicted least-recently-used.

Batching is continuous. Each base model has one decode loop, a thread that runs while requests
wait or decode (and ends when none is left). Requests on the model share one forward pass per
token step: rows are left-padded, with an attention mask and per-row position ids, over the
model's own KV cache (one cache row per request). A request that arrives while a batch decodes
**joins it at the next step**: it is prefilled (together with the other newcomers) and its cache
rows are merged into the batch's. A row that finishes (an end token, a stop sequence, its
``max_tokens``, the context, or its caller gone) leaves the batch at once: its cache rows are
dropped, and padding that no remaining row needs is trimmed away.

Adapters are never mixed within one forward pass: a batch serves one adapter, or the bare base.
A new batch serves the oldest waiting request's adapter and takes every waiting request on it
(in arrival order, up to the batch size), so requests on a few adapters that arrive interleaved
still share passes. A running batch admits newcomers only while the oldest waiting request names
its adapter; once it names another, the batch admits no one else and drains, then the next batch
serves that adapter — a busy adapter cannot starve another.

Each row samples with its own parameters and its own seeded generator, as a request served
alone does: a greedy row takes the argmax of its own logits, so its completion is the one it
gets alone. ``on_text`` is called from the decode loop, so it must return quickly (the
service's only hands the piece to its event loop); an error it raises ends that row alone.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.config import BaseModel_
from services.inference.backends.base import Adapter, Generation, Sampling
from services.models.chat_format import IM_END
from services.models.loading import load_model, load_tokenizer, resolve_model_dir, torch_device

log = logging.getLogger("rsigym.inference.local")

MAX_BATCH = 16
"""Rows decoded together in one forward pass; further requests wait for a row to leave."""


@dataclass(eq=False)
class _Row:
    """One request in (or waiting for) a batch."""

    ids: list[int]
    adapter: Adapter | None
    sampling: Sampling
    max_new: int
    on_text: Callable[[str], None] | None
    generator: Any
    result: Future[Generation] = field(default_factory=Future)
    out_ids: list[int] = field(default_factory=list)
    text: str = ""
    length: int = 0
    """Tokens of this row in the cache (its prompt, then each token fed back)."""
    last: int = -1
    """The token sampled last: the next step's input."""

    @property
    def adapter_key(self) -> str | None:
        return self.adapter.key if self.adapter is not None else None


@dataclass
class _Batch:
    """The rows decoding together, their KV cache and attention mask (one row each)."""

    rows: list[_Row] = field(default_factory=list)
    cache: Any = None
    mask: Any = None
    adapter_key: str | None = None
    scope: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    """The adapter setting of the batch (an active adapter, or adapters disabled) while it lasts."""


class _Loaded:
    def __init__(self, model: Any, tokenizer: Any):
        self.model = model  # becomes a PeftModel once the first adapter is loaded
        self.tokenizer = tokenizer
        self.lock = threading.Lock()
        """Guards ``waiting`` and ``running`` (the model itself is used by the decode loop alone)."""
        self.waiting: deque[_Row] = deque()
        self.running = False
        """A decode loop is serving this model."""
        self.adapters: OrderedDict[str, str] = OrderedDict()
        self.end_ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)}
        self.end_token_ids = sorted(i for i in self.end_ids if isinstance(i, int))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad or 0)
        self.cache_arg = _cache_argument(model)
        self.keeps_logits = "logits_to_keep" in _parameters(model)
        """The model computes the last position's logits only when asked (a prefill's others are not needed)."""


def _parameters(model: Any) -> Any:
    forward = model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward
    return inspect.signature(forward).parameters


def _cache_argument(model: Any) -> str:
    """The name under which the model takes and returns its KV cache: ``cache`` in recent
    transformers (``past_key_values`` is deprecated there and goes in 5.40), else
    ``past_key_values``."""
    return "cache" if "cache" in _parameters(model) else "past_key_values"


def _kv(cache: Any) -> list[tuple[Any, Any]] | None:
    """The (keys, values) tensors of each layer, ``[batch, heads, time, dim]``, when the cache is
    a plain dynamic one whose rows can be padded and concatenated; None otherwise."""
    from transformers import DynamicCache

    if type(cache) is not DynamicCache:
        return None
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers >= 4.56
        from transformers.cache_utils import DynamicLayer

        if not all(type(layer) is DynamicLayer and layer.keys is not None for layer in layers):
            return None
        return [(layer.keys, layer.values) for layer in layers]
    legacy: Any = cache  # transformers < 4.56: per-layer lists
    return list(zip(legacy.key_cache, legacy.value_cache, strict=True))


def _set_kv(cache: Any, tensors: list[tuple[Any, Any]]) -> None:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer, (keys, values) in zip(layers, tensors, strict=True):
            layer.keys, layer.values = keys, values
    else:
        cache.key_cache = [k for k, _ in tensors]
        cache.value_cache = [v for _, v in tensors]


def _pad_left(tensor: Any, width: int, dim: int) -> Any:
    import torch

    if width == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = width
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class LocalEngine:
    def __init__(self, models_dir: Path, max_adapters: int = 8, max_batch: int = MAX_BATCH):
        self.models_dir = models_dir
        self.max_adapters = max_adapters
        self.max_batch = max_batch
        self.device = torch_device()
        self._loaded: dict[str, _Loaded] = {}
        self._load_lock = threading.Lock()
        self.batch_sizes: list[int] = []
        """The rows of every forward pass so far (the newest last; bounded): what batching did."""

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
        """Queues the request on its base model's decode loop and waits for its completion."""
        import torch

        loaded = self._base(base)
        ids = loaded.tokenizer.encode(prompt, add_special_tokens=False)
        room = base.max_context - len(ids)
        if room <= 0:
            return Generation("", 0, "length")
        generator = torch.Generator(device=self.device)
        if sampling.seed is not None:
            generator.manual_seed(sampling.seed)
        else:
            generator.seed()
        row = _Row(ids=ids, adapter=adapter, sampling=sampling, max_new=min(sampling.max_tokens, room),
                   on_text=on_text, generator=generator)
        with loaded.lock:
            loaded.waiting.append(row)
            if not loaded.running:
                loaded.running = True
                threading.Thread(target=self._serve, args=(loaded,), name=f"rsigym-decode-{base.name}",
                                 daemon=True).start()
        return row.result.result()

    # The decode loop (one thread per base model, while there is work).

    def _serve(self, loaded: _Loaded) -> None:
        import torch

        batch = _Batch()
        try:
            while True:
                with loaded.lock:
                    if not batch.rows and not loaded.waiting:
                        loaded.running = False
                        return
                    newcomers = self._admit(loaded, batch)
                with torch.no_grad():
                    try:
                        if newcomers:
                            self._join(loaded, batch, newcomers)
                        if batch.rows:
                            self._step(loaded, batch)
                    except Exception as err:  # noqa: BLE001 - the model failed: every row of the pass gets the error
                        log.exception("local generation failed")
                        for row in {*batch.rows, *newcomers}:
                            if not row.result.done():
                                row.result.set_exception(err)
                        batch.rows = []
                    if not batch.rows:
                        self._reset(batch)
        except BaseException as err:  # the loop itself broke: fail everything it holds, never hang a caller
            with loaded.lock:
                loaded.running = False
                stranded = [*batch.rows, *loaded.waiting]
                loaded.waiting.clear()
            for row in stranded:
                if not row.result.done():
                    row.result.set_exception(err)
            raise

    def _admit(self, loaded: _Loaded, batch: _Batch) -> list[_Row]:
        """Waiting requests that join now (under ``loaded.lock``), in arrival order. A new batch
        takes the oldest request's adapter and every waiting request on it; a running one takes
        newcomers only while the oldest waiting request names its adapter (so it drains, and the
        oldest is served next, once another adapter waits)."""
        if not loaded.waiting:
            return []
        if batch.rows:
            if _kv(batch.cache) is None:
                return []  # a cache whose rows cannot be merged: newcomers start the next batch
            key, skip = batch.adapter_key, False
        else:
            key, skip = loaded.waiting[0].adapter_key, True
        room = self.max_batch - len(batch.rows)
        newcomers: list[_Row] = []
        kept: deque[_Row] = deque()
        while loaded.waiting and len(newcomers) < room:
            row = loaded.waiting.popleft()
            if row.adapter_key == key:
                newcomers.append(row)
            elif skip:
                kept.append(row)
            else:
                loaded.waiting.appendleft(row)
                break
        kept.extend(loaded.waiting)
        loaded.waiting.clear()
        loaded.waiting.extend(kept)
        return newcomers

    def _reset(self, batch: _Batch) -> None:
        batch.scope.close()
        batch.scope = contextlib.ExitStack()
        batch.cache = batch.mask = None

    def _open(self, loaded: _Loaded, batch: _Batch, adapter: Adapter | None) -> None:
        """A new batch: set the model up for its adapter, or disable the loaded adapters."""
        batch.adapter_key = adapter.key if adapter is not None else None
        if adapter is not None:
            self._activate(loaded, adapter)
        elif loaded.adapters and (disable := getattr(loaded.model, "disable_adapter", None)) is not None:
            batch.scope.enter_context(disable())

    def _forward(self, loaded: _Loaded, input_ids: Any, mask: Any, positions: Any, cache: Any) -> tuple[Any, Any]:
        """One forward pass: the last position's logits (float) and the updated cache."""
        extra = {"logits_to_keep": 1} if loaded.keeps_logits else {}
        out = loaded.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                           **{loaded.cache_arg: cache}, **extra)
        self.batch_sizes.append(int(input_ids.shape[0]))
        del self.batch_sizes[:-10_000]
        cache = out[loaded.cache_arg] if loaded.cache_arg in out else out.past_key_values
        return out.logits[:, -1].float(), cache

    def _join(self, loaded: _Loaded, batch: _Batch, newcomers: list[_Row]) -> None:
        """Prefill the newcomers together (left-padded), take each one's first token, and merge
        the cache rows of those still going into the batch."""
        import torch

        rows = [r for r in newcomers if not self._finished_early(r)]
        if not rows:
            return
        if not batch.rows:
            self._open(loaded, batch, rows[0].adapter)
        width = max(len(r.ids) for r in rows)
        input_ids = torch.tensor([[loaded.pad_id] * (width - len(r.ids)) + r.ids for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r.ids)) + [1] * len(r.ids) for r in rows], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(loaded, input_ids, mask, positions, None)
        for r in rows:
            r.length = len(r.ids)
        keep = self._advance(loaded, rows, logits)
        if not keep:
            return
        if len(keep) < len(rows):
            cache.batch_select_indices(torch.tensor(keep, device=self.device))
            mask = mask[keep]
        joined = [rows[i] for i in keep]
        if not batch.rows:
            batch.rows, batch.cache, batch.mask = joined, cache, mask
            self._trim(batch)
            return
        old, new = _kv(batch.cache), _kv(cache)
        assert old is not None and new is not None  # _admit lets newcomers join a mergeable batch only
        total = max(batch.mask.shape[1], mask.shape[1])
        grow_old, grow_new = total - batch.mask.shape[1], total - mask.shape[1]
        _set_kv(batch.cache, [(torch.cat([_pad_left(ko, grow_old, 2), _pad_left(kn, grow_new, 2)]),
                               torch.cat([_pad_left(vo, grow_old, 2), _pad_left(vn, grow_new, 2)]))
                              for (ko, vo), (kn, vn) in zip(old, new, strict=True)])
        batch.mask = torch.cat([_pad_left(batch.mask, grow_old, 1), _pad_left(mask, grow_new, 1)])
        batch.rows += joined
        self._trim(batch)

    def _step(self, loaded: _Loaded, batch: _Batch) -> None:
        """One token for every row of the batch, in one forward pass."""
        import torch

        gone = [i for i, r in enumerate(batch.rows) if self._finished_early(r)]
        if gone:
            self._drop(batch, [i for i in range(len(batch.rows)) if i not in gone])
            if not batch.rows:
                return
        input_ids = torch.tensor([[r.last] for r in batch.rows], device=self.device)
        positions = torch.tensor([[r.length] for r in batch.rows], device=self.device)
        mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
        logits, batch.cache = self._forward(loaded, input_ids, mask, positions, batch.cache)
        batch.mask = mask
        for r in batch.rows:
            r.length += 1
        keep = self._advance(loaded, batch.rows, logits)
        if len(keep) < len(batch.rows):
            self._drop(batch, keep)

    def _drop(self, batch: _Batch, keep: list[int]) -> None:
        import torch

        batch.rows = [batch.rows[i] for i in keep]
        if batch.rows:
            batch.cache.batch_select_indices(torch.tensor(keep, device=self.device))
            batch.mask = batch.mask[keep]
            self._trim(batch)

    def _trim(self, batch: _Batch) -> None:
        """Drop leading columns that are padding in every row."""
        kv = _kv(batch.cache)
        if kv is None:
            return
        used = batch.mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start > 0:
            _set_kv(batch.cache, [(k[:, :, start:], v[:, :, start:]) for k, v in kv])
            batch.mask = batch.mask[:, start:]

    def _finished_early(self, row: _Row) -> bool:
        """A row whose caller went away before its next token is finished (``cancelled``)."""
        if row.sampling.cancelled.is_set():
            self._finish(row, "cancelled")
            return True
        if row.max_new <= 0:
            self._finish(row, "length")
            return True
        return False

    def _advance(self, loaded: _Loaded, rows: list[_Row], logits: Any) -> list[int]:
        """Sample each row's next token from its logits; the indices of the rows still going."""
        young = [i for i, row in enumerate(rows) if len(row.out_ids) < row.sampling.min_tokens]
        if young:  # min_tokens: no end token for these rows yet
            import torch

            logits = logits.clone()
            logits[torch.tensor(young, device=logits.device)[:, None],
                   torch.tensor(loaded.end_token_ids, device=logits.device)] = float("-inf")
        greedy = logits.argmax(dim=-1).tolist()
        keep = []
        for i, row in enumerate(rows):
            token = int(greedy[i]) if row.sampling.temperature <= 0 else self._pick(logits[i], row.sampling, row.generator)
            if not self._accept(loaded, row, token):
                keep.append(i)
        return keep

    def _accept(self, loaded: _Loaded, row: _Row, token: int) -> bool:
        """Take one token into the row; True when the row is finished."""
        if token in loaded.end_ids:
            return self._finish(row, "stop")
        row.out_ids.append(token)
        new_text = loaded.tokenizer.decode(row.out_ids, skip_special_tokens=False)
        piece, row.text = new_text[len(row.text):], new_text
        hit = next((s for s in row.sampling.stop if s and s in row.text), None)
        if hit is not None:
            cut = row.text.index(hit)
            piece = piece[: max(0, len(piece) - (len(row.text) - cut))]
            row.text = row.text[:cut]
            return self._emit(row, piece) or self._finish(row, "stop")
        if self._emit(row, piece):
            return True
        if len(row.out_ids) >= row.max_new:
            return self._finish(row, "length")
        row.last = token
        return False

    def _emit(self, row: _Row, piece: str) -> bool:
        """Hand a piece to the row's reader; True when the reader failed (the row is ended with its error)."""
        if row.on_text is None or not piece:
            return False
        try:
            row.on_text(piece)
        except Exception as err:  # noqa: BLE001 - the reader's error is its caller's, not the batch's
            row.result.set_exception(err)
            return True
        return False

    @staticmethod
    def _finish(row: _Row, reason: str) -> bool:
        if not row.result.done():
            row.result.set_result(Generation(row.text, len(row.out_ids), reason))
        return True

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
