"""The interface every inference engine implements."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kit.config import BaseModel_


@dataclass(frozen=True)
class Adapter:
    """A LoRA checkpoint to serve. ``key`` is the checkpoint id: one name per version, never reused."""

    key: str
    path: str


@dataclass
class Sampling:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    min_tokens: int = 0
    """The end of the answer (an end token) is not generated before this many tokens."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when the caller has gone: the engine stops at its next token and returns what it has
    (finish_reason ``cancelled``)."""


@dataclass
class Generation:
    text: str
    completion_tokens: int
    finish_reason: str  # stop | length | cancelled


class InferenceEngine(Protocol):
    def prompt_tokens(self, base: BaseModel_, prompt: str) -> int: ...

    def generate(self, base: BaseModel_, adapter: Adapter | None, prompt: str, sampling: Sampling,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        """Blocking; ``on_text`` receives each new piece of text as it is decoded."""
        ...
