"""Resolving and loading base models (tokenizer + weights), cached per process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from services.core.config import BaseModel_
from services.core.errors import NotFound

_build_lock = threading.Lock()


def resolve_model_dir(model: BaseModel_, models_dir: Path,
                      on_step: Callable[[int, int], None] | None = None) -> Path:
    """The directory of a base model, building or converting it on first use (``on_step``
    follows a build's progress)."""
    if model.path == "builtin:tiny":
        from services.models.tiny import build_tiny

        with _build_lock:
            return build_tiny(models_dir, on_step=on_step)
    if model.path == "builtin:smollm2":
        from services.models.smollm2 import convert_smollm2

        with _build_lock:
            return convert_smollm2(models_dir)
    path = Path(model.path)
    if not (path / "config.json").exists():
        raise NotFound(f"base model {model.name!r}: no model at {path}")
    return path


@lru_cache(maxsize=8)
def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_model(path: str, device: str = "cpu") -> Any:
    """A fresh copy of the base weights (training mutates its copy; inference keeps one)."""
    from transformers import AutoModelForCausalLM

    # transformers types PreTrainedModel.to (a functools.wraps-decorated method) as if unbound.
    return AutoModelForCausalLM.from_pretrained(path).to(device)  # type: ignore[arg-type]


def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
