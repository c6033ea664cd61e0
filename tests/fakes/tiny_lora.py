"""Helpers for tests that serve the tiny model with LoRA adapters in-process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from services.models.loading import load_model


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """The tiny model is faster on one thread, and far faster on busy cores (no OpenMP spinning)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def random_lora(model_dir: Path, out: Path, seed: int) -> Path:
    """A LoRA with random (non-zero) weights: it changes the answers, so serving the wrong one shows."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(load_model(str(model_dir)), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                                  target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(3.0)
    model.save_pretrained(str(out))
    return out
