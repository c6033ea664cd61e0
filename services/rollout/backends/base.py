"""The interface every rollout backend implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from kit.config import RolloutModel
from services.rollout.schemas import ChatRequest


class RolloutBackend(Protocol):
    async def complete(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> dict[str, Any]:
        """One completion as an OpenAI ``chat.completion`` dict with ``usage``."""
        ...

    async def stream(self, model: RolloutModel, request: ChatRequest, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        """Opens the stream (errors raise here, before any chunk) and returns its chunks
        as OpenAI ``chat.completion.chunk`` dicts; the last carries ``usage`` when known."""
        ...
