"""Pydantic models of what the gateway answers.

Models accept unknown fields (``extra="allow"``) so a newer server never breaks an
older SDK; extra fields are reachable as attributes and appear in ``model_dump()``.

Top-level answers (:class:`Balance`, :class:`ChatCompletion`, :class:`Model`,
:class:`ChildKey`) also expose the HTTP response's ``request_id``, ``cost_usd`` and
``remaining_usd`` as read-only properties. They are stored in a pydantic
``PrivateAttr``, so they are not fields: ``model_dump()`` and ``model_dump_json()``
give exactly the server's data. Objects you build yourself have all three as ``None``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ._response import HasMeta, HasRequestMeta, ObjectList, ResponseMeta

__all__ = [
    "ResponseMeta",
    "ObjectList",
    "Balance",
    "ChatMessage",
    "Choice",
    "Usage",
    "ChatCompletion",
    "ChoiceDelta",
    "ChunkChoice",
    "ChatCompletionChunk",
    "Model",
    "ChildKey",
]


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")


class _WithMeta(_Base):
    _meta: ResponseMeta = PrivateAttr(default_factory=ResponseMeta)


class GymObject(HasMeta, _WithMeta):
    """A top-level answer: data fields plus response metadata (see module doc)."""


class Balance(HasRequestMeta, _WithMeta):
    """The run's money. ``remaining_usd`` is the body's field (the header says the same)."""

    budget_usd: float
    spent_usd: float
    reserved_usd: float
    remaining_usd: float


# ---- OpenAI-compatible chat completions -------------------------------------------


class ChatMessage(_Base):
    role: str
    content: str | None = None


class Choice(_Base):
    index: int = 0
    message: ChatMessage
    finish_reason: str | None = None


class Usage(_Base):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None  # RSIGym extension: what the call was charged


class ChatCompletion(GymObject):
    id: str
    object: str = "chat.completion"
    created: int = 0
    model: str
    choices: list[Choice]
    usage: Usage | None = None

    @property
    def text(self) -> str:
        """Content of the first choice ('' when there is none)."""
        return (self.choices[0].message.content or "") if self.choices else ""


class ChoiceDelta(_Base):
    role: str | None = None
    content: str | None = None


class ChunkChoice(_Base):
    index: int = 0
    delta: ChoiceDelta = Field(default_factory=ChoiceDelta)
    finish_reason: str | None = None


class ChatCompletionChunk(_Base):
    """One ``data:`` event of a streamed chat completion (metadata lives on the stream)."""

    id: str
    object: str = "chat.completion.chunk"
    created: int = 0
    model: str
    choices: list[ChunkChoice] = Field(default_factory=list)
    usage: Usage | None = None

    @property
    def text(self) -> str:
        """Content delta of the first choice ('' when there is none)."""
        return (self.choices[0].delta.content or "") if self.choices else ""


class Model(GymObject):
    id: str
    object: str = "model"
    created: int | None = None
    owned_by: str | None = None
    pricing: dict[str, Any] | None = None


# ---- keys ------------------------------------------------------------------------


class ChildKey(GymObject):
    """A key minted from the run's key, with its own (sub-)budget and policy.

    ``key`` holds the plaintext secret only in the answer to ``keys.mint()``; the
    gateway stores it hashed and never shows it again. It is kept out of ``repr()``.
    """

    id: str
    key: str | None = Field(default=None, repr=False)
    name: str | None = None
    parent_id: str | None = None
    status: str | None = None
    budget_usd: float | None = None
    policy: dict[str, Any] | None = None
    spent_usd: float | None = None
    reserved_usd: float | None = None
    created_at: datetime | None = None
