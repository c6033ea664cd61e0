"""How a policy knob is declared: its type, and the rule that keeps a child key within its parent.

A section of a key's policy (``services.<name>``) holds the knobs every section has (access/policy.py)
and the extras its service declares in its spec (``ServiceSpec.policy``): a :class:`PolicyExtras`
model whose every field carries one :class:`Narrowing` in its ``Annotated`` metadata::

    class SandboxPolicy(PolicyExtras):
        internet: Annotated[bool, OnlyOff("the parent key has no sandbox internet")] = False

Pydantic validates the knob's value; the narrowing rule says how a child key's value must relate
to its parent's, and is what ``Policy.assert_within`` runs. A knob without one is refused when the
policy vocabulary is built (:func:`narrowing_of`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

from kit.errors import PermissionDenied


class PolicyExtras(BaseModel):
    """A section's own knobs (none by default): subclass it, one ``Annotated`` field per knob."""

    model_config = ConfigDict(extra="forbid")


class Narrowing(ABC):
    """How a child's value of one knob must relate to its parent's."""

    @abstractmethod
    def check(self, child: Any, parent: Any, *, where: str, platform: bool) -> None:
        """Raise :class:`PermissionDenied` (``param=where``) if ``child`` grants more than ``parent``.
        ``platform``: the gym itself mints the key (an evaluation job's keys)."""

    def inherited(self, child: Any, parent: Any) -> Any:
        """The child's value once it inherits from its parent: its own (the default where it leaves
        the knob out) unless the rule takes the parent's."""
        return child


@dataclass(frozen=True)
class Cap(Narrowing):
    """A limit that may only shrink. None: no limit of its own; a child that leaves it out gets its
    parent's rather than being refused for not stating one."""

    message: str

    def check(self, child: Any, parent: Any, *, where: str, platform: bool) -> None:
        if parent is not None and (child is None or child > parent):
            raise PermissionDenied(self.message, param=where)

    def inherited(self, child: Any, parent: Any) -> Any:
        return parent if child is None else child


@dataclass(frozen=True)
class Allowlist(Narrowing):
    """A list that may only lose members, or ``"*"`` for everything. ``platform_may_widen``: a
    platform mint may name what the parent's list does not (the service checked it first)."""

    message: str
    platform_may_widen: bool = False

    def check(self, child: Any, parent: Any, *, where: str, platform: bool) -> None:
        if (platform and self.platform_may_widen) or parent == "*":
            return
        if child == "*" or not set(child) <= set(parent):
            raise PermissionDenied(self.message, param=where)


@dataclass(frozen=True)
class NamedSubset(Narrowing):
    """A list that may only lose members where both keys name one; None on either side is judged
    by the service that reads the knob, not here."""

    message: str

    def check(self, child: Any, parent: Any, *, where: str, platform: bool) -> None:
        if parent is not None and child is not None and not set(child) <= set(parent):
            raise PermissionDenied(self.message, param=where)


@dataclass(frozen=True)
class OnlyOff(Narrowing):
    """A grant a child may have only if its parent has it: it may only turn off."""

    message: str

    def check(self, child: Any, parent: Any, *, where: str, platform: bool) -> None:
        if child and not parent:
            raise PermissionDenied(self.message, param=where)


@dataclass(frozen=True)
class PlatformGranted(Narrowing):
    """A grant only the platform turns on; a parent that has it may pass it on."""

    message: str

    def check(self, child: Any, parent: Any, *, where: str, platform: bool) -> None:
        if child and not parent and not platform:
            raise PermissionDenied(self.message, param=where)


@dataclass(frozen=True)
class Levels(Narrowing):
    """A choice among ``levels``, narrowest first, that may only move towards the first."""

    message: str
    levels: Sequence[Any]

    def check(self, child: Any, parent: Any, *, where: str, platform: bool) -> None:
        if self.levels.index(child) > self.levels.index(parent):
            raise PermissionDenied(self.message, param=where)


def narrowing_of(name: str, field: FieldInfo) -> Narrowing:
    """The one narrowing rule a knob declares; a knob without one is a mistake in its declaration."""
    rules = [m for m in field.metadata if isinstance(m, Narrowing)]
    if len(rules) != 1:
        raise TypeError(f"policy knob {name!r} must declare exactly one narrowing rule, not {len(rules)}")
    return rules[0]
