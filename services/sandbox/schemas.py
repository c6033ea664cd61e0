"""Request bodies of the sandbox service (E2B's control-plane API, strict)."""

from __future__ import annotations

import posixpath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class DoorRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=8, max_length=200)
    """The key the door puts on every request it lets through (never shown to the sandbox)."""
    service: Literal["inference", "rollout"] = "inference"
    """Where the door leads: ``inference`` (an agent's sandbox: the evaluated model), or
    ``rollout`` (a judged task's verifier: the benchmark's judge, on the operator's key; what it
    is asked is kept for the trial's result — services/sandbox/door.py)."""


MAX_DIRS = 32
"""The most directories one create makes (``rsigymDirs``)."""
MAX_DIR_PATH = 1024


def normal_dir_path(path: str) -> bool:
    """Whether ``path`` is one ``rsigymDirs`` takes: absolute and normal (no ``..``, ``.``, ``//``
    or trailing ``/``), not "/" itself, no NUL, at most :data:`MAX_DIR_PATH` characters."""
    return (1 < len(path) <= MAX_DIR_PATH and path.startswith("/") and not path.startswith("//")
            and posixpath.normpath(path) == path and "\0" not in path)


class DirRequest(BaseModel):
    """A directory the sandbox starts with (the gym's extension ``rsigymDirs``): what a Docker
    run's mount points are to a container, and what Harbor would otherwise make with its first
    command (``mkdir -p``, then ``chmod``)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    mode: int | None = Field(default=None, ge=0, le=0o777)
    """Permission bits (a JSON number: 511 is 0o777); none: the sandbox's default."""

    @field_validator("path")
    @classmethod
    def _normal_absolute(cls, path: str) -> str:
        if not normal_dir_path(path):
            raise ValueError(f"must be a normal absolute path (no '..', '.', '//' or trailing '/'), "
                             f"at most {MAX_DIR_PATH} characters")
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
    rsigym_dirs: list[DirRequest] = Field(default_factory=list, alias="rsigymDirs", max_length=MAX_DIRS)
    """The gym's extension: directories made (and given their modes) before the create answers."""
