"""Track presets: the policies an operator starts a run key from.

A preset (``presets/<track>.toml``) holds the track's ``policy``, the artifacts its
``submission`` must contain and its named ``budgets``. Model names are not written into a
preset but rendered from the gym config's ``[tracks]`` (kit/config.py):

* ``"@base"`` — the base model the track trains from (a string);
* ``"@instruct"`` — the harness track's one model (a string);
* ``"@teachers"`` — the teacher catalogue (a list; inside a list it is spliced in);
* ``"@offline_teacher"`` — the offline modifier's one teacher (dropped when there is none);
* ``"@none"`` — JSON null, which TOML cannot write (``{fixed = "@none"}`` refuses any value).

``offline`` is a modifier on any track (``presets/offline.toml`` is laid over the track's
policy); ``--track offline`` stays accepted and means joint + offline. A key's stored track
label is ``data``, ``harness``, ``joint`` or ``<track>+offline`` (:func:`track_label`,
:func:`parse_track`).
"""

from __future__ import annotations

import copy
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from access.policy import Policy
from kit.config import GymConfig
from kit.errors import Unprocessable, validated
from kit.file_errors import read_model

PRESETS_DIR = Path(__file__).parent / "presets"
BASE_TRACKS = ("data", "harness", "joint")
TRACKS = (*BASE_TRACKS, "offline")
"""What ``--track`` accepts; ``offline`` alone is joint + offline."""
OFFLINE = "offline"
ARTIFACTS = ("checkpoint", "harness")


def _unknown(track: str) -> Unprocessable:
    return Unprocessable(f"unknown track {track!r}; expected one of {', '.join(TRACKS)}", param="track")


@cache
def _raw(name: str) -> dict[str, Any]:
    with open(PRESETS_DIR / f"{name}.toml", "rb") as fh:
        return tomllib.load(fh)


def resolve_track(track: str, offline: bool = False) -> tuple[str, bool]:
    """``(base track, offline)`` for what an operator asked: ``offline`` alone is joint + offline."""
    if track == OFFLINE:
        return "joint", True
    if track not in BASE_TRACKS:
        raise _unknown(track)
    return track, offline


def track_label(track: str, offline: bool = False) -> str:
    """The label a run key stores: ``data``, ``joint+offline``, …"""
    base, off = resolve_track(track, offline)
    return f"{base}+{OFFLINE}" if off else base


def parse_track(label: str | None) -> tuple[str | None, bool]:
    """A stored label back to ``(base track, offline)``; ``(None, False)`` for a key without a
    track (a custom policy) or a label this version does not know."""
    if not label:
        return None, False
    base, _, modifier = label.partition("+")
    if modifier not in ("", OFFLINE):
        return None, False
    try:
        return resolve_track(base, modifier == OFFLINE)
    except Unprocessable:
        return None, False


def _render(value: Any, config: GymConfig) -> Any:
    t = config.tracks
    if isinstance(value, dict):
        return {k: _render(v, config) for k, v in value.items()}
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            if item == "@teachers":
                out.extend(t.teachers or [])
            elif item == "@offline_teacher":
                out.extend([t.offline_teacher] if t.offline_teacher else [])
            else:
                out.append(_render(item, config))
        return out
    if not isinstance(value, str) or not value.startswith("@"):
        return value
    if value == "@none":
        return None
    if value == "@teachers":
        return list(t.teachers or [])
    names = {"@base": t.base_model, "@instruct": t.instruct_model, "@offline_teacher": t.offline_teacher}
    if value not in names:
        raise ValueError(f"unknown preset placeholder {value!r}")
    if names[value] is None:
        raise Unprocessable(f"the gym config names no model for {value} (see [tracks]); this track cannot be "
                            "minted on this gym", param="track")
    return names[value]


def _overlay(policy: dict[str, Any], modifier: dict[str, Any]) -> dict[str, Any]:
    """Lay a modifier's service settings over a policy's: only services the track grants."""
    out = copy.deepcopy(policy)
    for name, settings in modifier.get("services", {}).items():
        if name in out.get("services", {}):
            out["services"][name].update(copy.deepcopy(settings))
    rollout = out.get("services", {}).get("rollout")
    if rollout is not None and rollout.get("models") == []:
        del out["services"]["rollout"]  # an offline gym without a teacher: no rollout at all
    return out


def preset_policy(track: str, config: GymConfig, *, offline: bool = False) -> Policy:
    """The policy of ``track`` (``data``, ``harness``, ``joint``; ``offline`` = joint + offline)
    rendered against ``config``; ``offline`` lays the offline modifier over it."""
    base, off = resolve_track(track, offline)
    raw = _render(_raw(base)["policy"], config)
    if off:
        raw = _overlay(raw, _render(_raw(OFFLINE)["policy"], config))
    # The one validation every policy gets (a misspelt section in a preset is named, not a traceback).
    return validated(Policy, raw, what=f"preset {PRESETS_DIR / base}.toml", prefix="policy.")


def submission_needs(track_or_label: str | None) -> tuple[str, ...]:
    """The artifacts a submission of this track must contain (``()`` for a key without a track)."""
    base, _ = parse_track(track_or_label)
    if base is None:
        return ()
    needs = tuple(_raw(base).get("submission", {}).get("needs", ()))
    assert set(needs) <= set(ARTIFACTS), f"preset {base}: unknown artifact in {needs}"
    return needs


def budgets(track: str) -> dict[str, float]:
    """The track's named budgets (USD): ``small``, ``standard``, ``large``."""
    base, _ = resolve_track(track)
    return {name: float(usd) for name, usd in _raw(base).get("budgets", {}).items()}


def budget_usd(track: str | None, budget: str | float) -> float:
    """A budget given as a number of USD or as the name of one of the track's budgets."""
    if not isinstance(budget, str):
        return float(budget)
    try:
        return float(budget)
    except ValueError:
        pass
    if track is None:
        raise Unprocessable(f"a named budget ({budget!r}) needs a track", param="budget")
    named = budgets(track)
    if budget not in named:
        raise Unprocessable(f"unknown budget {budget!r} for the {track} track; expected a number of USD or one of "
                            f"{', '.join(named)}", param="budget")
    return named[budget]


def policy_from_file(path: Path | str) -> Policy:
    """A policy file is TOML or JSON with the same shape as a preset's ``policy``; a mistake in it
    is a :class:`~kit.file_errors.FileError` naming the file, the key and what is allowed."""
    return read_model(path, Policy, what="policy file")
