"""Resolving and loading base models (tokenizer + weights), cached per process."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from kit.config import BaseModel_
from kit.errors import NotFound

_build_lock = threading.Lock()
_import_lock = threading.Lock()
_load_lock = threading.Lock()
_imported = False


def import_ml() -> None:
    """Resolve transformers' and peft's names once, one thread at a time. transformers exports its
    names lazily, and two threads resolving them at once (a training job loading its model while
    the first inference request loads the base) can make one fail with ``cannot import name
    'AutoModelForCausalLM'`` — a 500 to whoever came second. Once resolved they are plain module
    attributes, and every later import is safe."""
    global _imported
    if _imported:
        return
    with _import_lock:
        if not _imported:
            import peft  # noqa: F401 - imported for its side effect: transformers' submodules it pulls in
            from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: F401

            _imported = True


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve_model_dir(model: BaseModel_, models_dir: Path,
                      on_step: Callable[[int, int], None] | None = None) -> Path:
    """The directory of a base model, building or converting it on first use (``on_step``
    follows a build's progress)."""
    if model.path == "builtin:tiny":
        from services.models.tiny import build_tiny

        with _build_lock:  # its log on stderr: a CLI's stdout is its answer (`rsigym score --json`)
            return build_tiny(models_dir, on_step=on_step, log=_to_stderr)
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
    import_ml()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_model(path: str, device: str = "cpu") -> Any:
    """A fresh copy of the base weights (training mutates its copy; inference keeps one).

    One load at a time per process: ``from_pretrained`` builds the model under process-wide
    switches of torch (weights first on the meta device), and two loads in two threads at once can
    leave one with meta tensors ("Cannot copy out of meta tensor")."""
    import_ml()
    from transformers import AutoModelForCausalLM

    with _load_lock:
        # transformers types PreTrainedModel.to (a functools.wraps-decorated method) as if unbound.
        return AutoModelForCausalLM.from_pretrained(path).to(device)  # type: ignore[arg-type]


def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
