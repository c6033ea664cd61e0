"""Request bodies of the sandbox service (E2B's control-plane API, strict)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DoorRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=8, max_length=200)
    """The key the door puts on every request it lets through (never shown to the sandbox)."""


class CreateSandbox(BaseModel):
    """E2B's NewSandbox body (v1 and v2), strict: unknown fields are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    template_id: str | None = Field(default=None, alias="templateID", max_length=64)
    timeout: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)
    env_vars: dict[str, str] = Field(default_factory=dict, alias="envVars", max_length=256)
    allow_internet_access: bool | None = Field(default=None, alias="allow_internet_access")
    secure: bool | None = None
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    rsigym_door: DoorRequest | None = Field(default=None, alias="rsigymDoor")
    """The gym's extension: a model door (keys with a platform-granted ``door`` only)."""
