"""The training job request. Every field can be constrained by the key's policy
(``lora.rank``, ``learning_rate``, …); the Data track fixes them all."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

NOT_CONFIG = frozenset({"datasets", "experiment"})
"""Request fields that are not the job's training configuration (stored apart)."""
DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int = Field(default=16, ge=1, le=256)
    alpha: float = Field(default=32, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGETS), min_length=1)


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    datasets: list[str] = Field(min_length=1, max_length=32)
    base_model: str | None = None
    parent_checkpoint: str | None = None
    lora: LoraSpec = Field(default_factory=LoraSpec)
    learning_rate: float = Field(default=1e-3, gt=0, le=1)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    steps: int | None = Field(default=None, gt=0)
    epochs: float | None = Field(default=None, gt=0)
    batch_size: int = Field(default=16, ge=1, le=1024)
    max_length: int = Field(default=256, ge=8, le=32768)
    seed: int = 0
    loss: Literal["cross_entropy", "custom"] = "cross_entropy"
    custom_loss: str | None = Field(default=None, max_length=100_000)
    """Python source defining ``loss(logits, labels, mask) -> torch scalar``; needs loss = "custom"."""
    checkpoint_every: int = Field(default=50, ge=1)
    experiment: str | None = Field(default=None, max_length=40)
    """The caller's own experiment to attach the job to (default: a new implicit one). Not
    part of the training configuration: it changes neither ``config`` nor ``config_hash``."""

    @model_validator(mode="after")
    def _consistent(self) -> JobRequest:
        if (self.base_model is None) == (self.parent_checkpoint is None):
            raise ValueError("give exactly one of base_model or parent_checkpoint")
        if (self.loss == "custom") != (self.custom_loss is not None):
            raise ValueError('custom_loss is required with loss = "custom" and only then')
        if self.steps is None and self.epochs is None:
            raise ValueError("give steps or epochs")
        return self

    def config_hash(self) -> str:
        body = self.model_dump(mode="json", exclude={*NOT_CONFIG, "custom_loss"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def loss_module_hash(self) -> str | None:
        return hashlib.sha256(self.custom_loss.encode()).hexdigest() if self.custom_loss else None
