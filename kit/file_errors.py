"""One-paragraph errors for an operator's files (the gym config, a policy file).

A typo in ``gym.toml`` used to end ``rsigym up`` with a pydantic traceback. :func:`read_model`
reads a TOML (or JSON) file into a pydantic model and turns every way it can fail — missing,
unreadable, not TOML, a key the model does not have, a value of the wrong kind — into a
:class:`FileError` naming the file, the key and what is allowed there; the CLI prints that and
exits 2.
"""

from __future__ import annotations

import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
_SHOWN_ERRORS = 3


class FileError(Exception):
    """A file an operator wrote is not what the gym can use; ``str()`` says why, in one paragraph."""


def read_model(path: Path | str, model: type[M], *, what: str) -> M:
    """``path`` (TOML, or JSON when it ends in ``.json``) validated as ``model``; ``what`` names
    the kind of file in the message ("gym config", "policy file")."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as err:
        raise FileError(f"{what} {path}: cannot be read ({err.strerror or err})") from err
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as err:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise FileError(f"{what} {path}: not valid {kind}: {err}") from err
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise FileError(f"{what} {path}: " + describe(err, model)) from err


def describe(err: ValidationError, model: type[BaseModel]) -> str:
    """The validation errors as sentences: the dotted key, what is wrong, what is allowed."""
    parts = []
    # A misspelt key shows as "not a setting" *and* as the real one "required": the typo first.
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    for e in errors[:_SHOWN_ERRORS]:
        loc = [p for p in e["loc"] if not str(p).startswith(("function-", "tagged-union")) and p != "[key]"]
        key = ".".join(str(p) for p in loc) or "(the whole file)"
        if e["loc"][-1:] == ("[key]",):  # a mapping key refused (a policy's unknown section): the message says it all
            parts.append(f"{key}: {e['msg']}")
        elif e["type"] == "extra_forbidden":
            allowed = _fields_at(model, loc[:-1])
            parts.append(f"{key} is not a setting here" + (f"; allowed: {', '.join(allowed)}" if allowed else ""))
        elif e["type"] == "missing":
            parts.append(f"{key} is required")
        else:
            parts.append(f"{key} = {_short(e.get('input'))}: {e['msg']}")
    more = len(err.errors()) - _SHOWN_ERRORS
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "") + "."


def _fields_at(model: type[BaseModel], loc: list[Any]) -> list[str]:
    """The keys allowed at ``loc`` (a validation error's location) of ``model``."""
    annotation: Any = model
    for part in loc:
        annotation = _unoptional(annotation)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (list, tuple, set, frozenset) and args:
            annotation = args[0]  # ``part`` is an item's index
        elif origin is dict and len(args) == 2:
            annotation = args[1]  # ``part`` is a key of the mapping
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            info = next((f for name, f in annotation.model_fields.items() if part in (name, f.alias)), None)
            if info is None:
                return []
            annotation = info.annotation
        else:
            return []
    annotation = _unoptional(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return sorted((f.alias or name) for name, f in annotation.model_fields.items())
    return []


def _unoptional(annotation: Any) -> Any:
    """``X`` of ``X | None`` (and of ``Optional[X]``)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kept = [a for a in typing.get_args(annotation) if a is not type(None)]
        return kept[0] if len(kept) == 1 else annotation
    return annotation


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "…"
