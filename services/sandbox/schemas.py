"""Request bodies of the sandbox service (E2B's control-plane API, strict)."""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field, field_validator


class DoorRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=8, max_length=200)
    """The key the door puts on every request it lets through (never shown to the sandbox)."""


class DirRequest(BaseModel):
    """A directory the sandbox starts with (the gym's extension ``rsigymDirs``): what a Docker
    run's mount points are to a container, and what Harbor would otherwise make with its first
    command (``mkdir -p``, then ``chmod``)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=2, max_length=1024)
    mode: int | None = Field(default=None, ge=0, le=0o777)
    """Permission bits (a JSON number: 511 is 0o777); none: the sandbox's default."""

    @field_validator("path")
    @classmethod
    def _normal_absolute(cls, path: str) -> str:
        if not path.startswith("/") or path.startswith("//") or posixpath.normpath(path) != path or "\0" in path:
            raise ValueError("must be a normal absolute path (no '..', '.', '//' or trailing '/')")
        return path


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
    rsigym_dirs: list[DirRequest] = Field(default_factory=list, alias="rsigymDirs", max_length=32)
    """The gym's extension: directories made (and given their modes) before the create answers."""
