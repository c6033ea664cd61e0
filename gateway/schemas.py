"""Request bodies of the gateway's own routes (admin and agent key management)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateKey(_Body):
    track: str | None = None
    policy: dict[str, Any] | None = None
    budget_usd: float = Field(ge=0, allow_inf_nan=False)
    name: str | None = Field(default=None, max_length=200)


class MintChildKey(_Body):
    name: str | None = Field(default=None, max_length=200)
    policy: dict[str, Any] | None = None
    """Defaults to the parent's own policy."""
    budget_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Optional sub-budget; the parent's budget always applies too."""


class TopUp(_Body):
    amount_usd: float = Field(gt=0, allow_inf_nan=False)


class EditPolicy(_Body):
    policy: dict[str, Any]
