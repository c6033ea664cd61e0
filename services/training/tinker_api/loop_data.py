"""What a Tinker loop trained on and sampled, kept as training data of its run (issue 56).

A loop hands the gym token ids, not rows, so the audit would see nothing of it unless the gym
writes it down. Every ``forward_backward`` datum (not ``forward``: nothing is trained) and every
sampled sequence becomes a *loop row* (services/models/training_text.py), appended to the
training model's file ``<data dir>/tinker/loop/<model id>.jsonl``:

``{"loop": {"source": "forward_backward", "model_id", "step", "loss_fn", "text", "tokens",
"targets", "weights_nonzero", "weight_sum", "advantage_sum"}}`` — ``tokens`` the full sequence
(the model input, then its last target when the targets are the input shifted by one, as a
next-token datum's are; else the input followed by all of its targets), ``text`` those ids
decoded with the base model's tokenizer, special tokens kept; ``weight_sum`` / ``advantage_sum``
the datum's loss weights and advantages summed (its reward signal, when an RL loss has one).

``{"loop": {"source": "sample", "model_id", "sampler_id", "model_path", "text", "tokens",
"prompt_tokens"}}`` — one row per sampled sequence: the prompt's ids then the completion's.

A line is written whole in one ``write`` and flushed; a reader takes complete lines only, so a
crash mid-write leaves at most a partial last line that nothing reads. :meth:`LoopData.register`
turns the rows written since the last registration into a dataset of the run
(services/training/datasets.py ``DatasetStore.record``: content-addressed, ``dataset.registered``)
— a *segment* — so a model's datasets are its segments in order, and nothing is stored twice.
The offset already registered is kept beside the file (``<model id>.json``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.private_files import private_dir, write_private
from services.models.training_text import LOOP
from services.training.datasets import DatasetStore

TARGETS = "target_tokens"


def full_sequence(tokens: Sequence[int], loss_fn_inputs: dict[str, Any]) -> tuple[list[int], str]:
    """The ids a datum trains on as one sequence, and how its targets were laid (``shifted``:
    the input's next tokens; ``appended``: anything else, written after the input; ``none``)."""
    tokens = [int(t) for t in tokens]
    targets = [int(t) for t in loss_fn_inputs.get(TARGETS) or []]
    if not targets:
        return tokens, "none"
    if len(targets) == len(tokens) and targets[:-1] == tokens[1:]:
        return tokens + targets[-1:], "shifted"
    return tokens + targets, "appended"


def _total(values: Any) -> float | None:
    try:
        return float(sum(float(v) for v in values)) if values is not None else None
    except (TypeError, ValueError):
        return None


class LoopData:
    """The loop rows of every training model this process serves, and their registration."""

    def __init__(self, root: Path, datasets: DatasetStore):
        self.root = root
        self.datasets = datasets
        self._lock = threading.Lock()
        self._owners: dict[str, threading.Lock] = {}
        self._tokenizers: dict[str, Any] = {}

    def _owner_lock(self, model_id: str) -> threading.Lock:
        with self._lock:
            return self._owners.setdefault(model_id, threading.Lock())

    def path(self, model_id: str) -> Path:
        return self.root / f"{model_id}.jsonl"

    def tokenizer(self, base_path: Path) -> Any:
        """The base model's tokenizer (loaded once per base)."""
        key = str(base_path)
        with self._lock:
            found = self._tokenizers.get(key)
        if found is None:
            from services.models.loading import load_tokenizer

            found = load_tokenizer(key)
            with self._lock:
                found = self._tokenizers.setdefault(key, found)
        return found

    def decode(self, base_path: Path, ids: list[int]) -> str:
        """``ids`` as the base model's text, special tokens and spacing exactly as they are."""
        return str(self.tokenizer(base_path).decode(ids, skip_special_tokens=False,
                                                    clean_up_tokenization_spaces=False))

    def _append(self, model_id: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        data = "".join(json.dumps({LOOP: r}, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
        with self._owner_lock(model_id):
            private_dir(self.root)
            fd = os.open(self.path(model_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(data.encode("utf-8"))
                while view:  # whole lines, or (on a crash) a partial last one that no reader takes
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)

    def trained(self, model_id: str, base_path: Path, data: Sequence[Any], loss_fn: str, step: int) -> None:
        """Rows for a ``forward_backward`` batch that ran (``data``: wire datums)."""
        rows = []
        for datum in data:
            ids, laid = full_sequence(datum.tokens, datum.loss_fn_inputs)
            weights = datum.loss_fn_inputs.get("weights")
            rows.append({"source": "forward_backward", "model_id": model_id, "step": step, "loss_fn": loss_fn,
                         "text": self.decode(base_path, ids), "tokens": ids, "targets": laid,
                         "weights_nonzero": sum(1 for w in weights or [] if w) if weights is not None else None,
                         "weight_sum": _total(weights),
                         "advantage_sum": _total(datum.loss_fn_inputs.get("advantages"))})
        self._append(model_id, rows)

    def sampled(self, model_id: str, base_path: Path, prompt: list[int], sequences: Sequence[list[int]], *,
                sampler_id: str, model_path: str | None) -> None:
        """Rows for a sample call: each sequence with its prompt."""
        rows = []
        for seq in sequences:
            ids = [*prompt, *(int(t) for t in seq)]
            rows.append({"source": "sample", "model_id": model_id, "sampler_id": sampler_id, "model_path": model_path,
                         "text": self.decode(base_path, ids), "tokens": ids, "prompt_tokens": len(prompt)})
        self._append(model_id, rows)

    def _registered(self, model_id: str) -> int:
        try:
            return int(json.loads((self.root / f"{model_id}.json").read_text())["registered"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def register(self, model_id: str, *, run_id: str, key_id: str) -> dict[str, Any] | None:
        """The rows written since the last registration, as a dataset of the run (its view: ``id``,
        ``sha256`` …); None when there are none."""
        with self._owner_lock(model_id):
            start = self._registered(model_id)
            try:
                with open(self.path(model_id), "rb") as fh:
                    fh.seek(start)
                    tail = fh.read()
            except FileNotFoundError:
                return None
            raw = tail[: tail.rfind(b"\n") + 1]  # complete lines only
            if not raw:
                return None
            rows = raw.count(b"\n")
            view = self.datasets.record(run_id=run_id, key_id=key_id, raw=raw, rows=rows,
                                        name=f"tinker loop {model_id} (bytes {start}-{start + len(raw)})")
            marker = self.root / f"{model_id}.json"
            tmp = marker.with_suffix(".json.tmp")
            write_private(tmp, json.dumps({"run_id": run_id, "registered": start + len(raw)}))
            os.replace(tmp, marker)
            return view
