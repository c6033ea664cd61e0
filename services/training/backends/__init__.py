"""Training backends, chosen by the base model's ``backend`` through one registry.

``local`` (and ``vllm``: vLLM only serves PEFT checkpoints trained here) → backends/local.py,
``tinker`` → backends/tinker.py. Each implements ``services.training.trainer.Trainer``;
``services.training.trainer.run_training`` drives any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kit.backends import Registry

if TYPE_CHECKING:
    from kit.config import BaseModel_
    from services.training.trainer import Trainer


@dataclass
class TrainerSetup:
    """What a trainer factory may use: the base model, and what the job runner holds."""

    base: BaseModel_
    device: str = "cpu"
    tinker_client: Any = None


TrainerFactory = Callable[[TrainerSetup], "Trainer"]

TRAINERS: Registry[TrainerFactory] = Registry("trainer", lazy={
    "local": "services.training.backends.local",
    "vllm": "services.training.backends.local",
    "tinker": "services.training.backends.tinker",
})
