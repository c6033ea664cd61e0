"""One registry per extension point: backend name → implementation.

Each service declares its registry next to its backends (``services/<svc>/backends/__init__.py``)
and picks a backend by the name its config gives, never with an if/else over names::

    TRAINERS: Registry[TrainerFactory] = Registry("trainer", lazy={"tinker": "services.training.backends.tinker"})

    @TRAINERS.register("tinker")
    def make_tinker(setup: TrainerSetup) -> Trainer: ...

    trainer = TRAINERS.get(base.backend)(setup)

``lazy`` maps a name to the module that registers it, imported on the first ``get``: a
backend with heavy or optional dependencies (torch, vllm, tinker, e2b) costs nothing until
a gym is configured to use it, and the spec modules the gateway imports stay light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

from kit.errors import ServiceUnavailable


class UnknownBackend(ServiceUnavailable):
    """A name no implementation was registered under (a configuration error)."""


class Registry[T]:
    def __init__(self, kind: str, *, lazy: Mapping[str, str] | None = None):
        self.kind = kind
        self._lazy = dict(lazy or {})
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("local")`` on a class or factory function."""

        def add(entry: T) -> T:
            if name in self._entries and self._entries[name] is not entry:
                raise ValueError(f"{self.kind} backend {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def names(self) -> list[str]:
        return sorted(set(self._entries) | set(self._lazy))

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def get(self, name: str) -> T:
        if name not in self._entries and name in self._lazy:
            importlib.import_module(self._lazy[name])
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownBackend(f"no {self.kind} backend named {name!r}; known: {', '.join(self.names()) or 'none'}")
        return entry
