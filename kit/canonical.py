"""One spelling per field, before any policy looks at a request body.

A policy rule names a field by one spelling (``templateID``, ``max_tokens``), but a service
may accept the same field under several: pydantic aliases (``template_id`` as well as
``templateID`` under ``populate_by_name``, ``AliasChoices``) and API synonyms that mean the
same thing (OpenAI's ``max_completion_tokens`` for ``max_tokens``). Matched as they come, a
rule on one spelling is side-stepped by another. So the gateway rewrites every body to the
canonical spelling of each field of the operation's request schema (recursively through
nested models) *before* it applies policies, and refuses a body that gives one field twice
under two spellings with different values. The service then sees only canonical names.

Canonical is the name on the wire that the API documents: the field's ``alias`` when it has
one (E2B's camelCase), else its Python name; for a synonym, the name it stands for.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import AliasChoices, AliasPath, BaseModel

from kit.errors import Unprocessable


@dataclass(frozen=True)
class Spellings:
    """The accepted spellings of every field of one request schema, nested models included."""

    canonical: dict[str, str] = field(default_factory=dict)
    """accepted spelling → canonical spelling (canonical spellings map to themselves)."""
    nested: dict[str, Spellings] = field(default_factory=dict)
    """canonical spelling → the spellings of the nested model it holds."""

    def alternatives(self, prefix: str = "") -> Iterator[tuple[str, str]]:
        """(dotted canonical path, dotted path with one non-canonical spelling) for every
        non-canonical spelling, at every depth — what a test must prove covered."""
        for spelled, canonical in self.canonical.items():
            if spelled != canonical:
                yield prefix + canonical, prefix + spelled
        for canonical, inner in self.nested.items():
            yield from inner.alternatives(prefix + canonical + ".")

    def canonical_path(self, path: str) -> str:
        """A dotted policy path with each segment in its canonical spelling."""
        out: list[str] = []
        level: Spellings | None = self
        parts = path.split(".")
        for part in parts:
            if level is None:
                out.append(part)
                continue
            name = level.canonical.get(part, part)
            out.append(name)
            level = level.nested.get(name)
        return ".".join(out)


def spellings_of(schema: type[BaseModel], synonyms: Mapping[str, str] | None = None) -> Spellings:
    canonical: dict[str, str] = {}
    nested: dict[str, Spellings] = {}
    by_name = bool(schema.model_config.get("populate_by_name") or schema.model_config.get("validate_by_name"))
    for name, info in schema.model_fields.items():
        wire = info.alias or name
        accepted = set(_validation_names(info.validation_alias)) or {wire}
        if by_name or not (info.alias or info.validation_alias):
            accepted.add(name)
        accepted.add(wire)
        for spelled in accepted:
            canonical[spelled] = wire
        inner = _nested_model(info.annotation)
        if inner is not None:
            nested[wire] = spellings_of(inner)
    for synonym, target in (synonyms or {}).items():
        if target not in canonical.values():
            raise ValueError(f"synonym {synonym!r} names {target!r}, which {schema.__name__} does not have")
        canonical[synonym] = target
    return Spellings(canonical, nested)


def canonical_body(body: dict[str, Any], spellings: Spellings | None) -> dict[str, Any]:
    """The body with every known field under its canonical spelling (422 on a conflict).
    Unknown keys are left as they are: the service's own schema refuses or drops them."""
    if spellings is None:
        return body
    return _rewrite(body, spellings, "")


def _rewrite(body: dict[str, Any], spellings: Spellings, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in body.items():
        name = spellings.canonical.get(key, key)
        if name in out:
            if out[name] != value:
                raise Unprocessable(
                    f"{prefix}{given[name]} and {prefix}{key} are the same field ({prefix}{name}) with different "
                    "values; give it once", param=prefix + name)
            continue
        inner = spellings.nested.get(name)
        out[name] = _rewrite(value, inner, f"{prefix}{name}.") if inner and isinstance(value, dict) else value
        given[name] = key
    return out


def _validation_names(alias: str | AliasPath | AliasChoices | None) -> list[str]:
    if alias is None:
        return []
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasPath):
        return [alias.path[0]] if isinstance(alias.path[0], str) else []
    return [n for choice in alias.choices for n in _validation_names(choice)]


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds as a JSON object (``Model``, ``Model | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _nested_model(arg)
            if found is not None:
                return found
    return None
