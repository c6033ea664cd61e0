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


class GymConfig(_Strict):
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)

    def provider_key_envs(self) -> list[str]:
        return [m.api_key_env for m in self.rollout.models if m.api_key_env]


def load_config(path: Path | str | None) -> GymConfig:
    if path is None:
        return GymConfig()
    with open(path, "rb") as fh:
        return GymConfig.model_validate(tomllib.load(fh))
