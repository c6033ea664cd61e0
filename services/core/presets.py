"""Track presets: the policies an operator starts a run key from."""

from __future__ import annotations

import tomllib
from pathlib import Path

from services.core.errors import Unprocessable
from services.core.policy import Policy

PRESETS_DIR = Path(__file__).parent / "presets"
TRACKS = ("data", "harness", "joint", "offline")


def preset_policy(track: str) -> Policy:
    if track not in TRACKS:
        raise Unprocessable(f"unknown track {track!r}; expected one of {', '.join(TRACKS)}", param="track")
    with open(PRESETS_DIR / f"{track}.toml", "rb") as fh:
        return Policy.model_validate(tomllib.load(fh))


def policy_from_file(path: Path | str) -> Policy:
    """A policy file is TOML or JSON with the same shape as a preset."""
    text = Path(path).read_bytes()
    if str(path).endswith(".json"):
        return Policy.model_validate_json(text)
    return Policy.model_validate(tomllib.loads(text.decode()))
