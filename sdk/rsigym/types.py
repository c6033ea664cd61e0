"""Pydantic models of what the gateway answers.

Models accept unknown fields (``extra="allow"``) so a newer server never breaks an
older SDK; extra fields are reachable as attributes and appear in ``model_dump()``.

Top-level answers (:class:`ChatCompletion`, :class:`Model`) also expose the HTTP
response's ``request_id``, ``cost_usd`` and ``remaining_usd`` as read-only properties.
They are stored in a pydantic ``PrivateAttr``, so they are not fields: ``model_dump()``
and ``model_dump_json()`` give exactly the server's data. Objects you build yourself
have them as ``None``. :class:`Balance` and :class:`ChildKey` have a ``remaining_usd``
*field* of their own (from the body), so only ``request_id`` and ``cost_usd`` come from
the headers there.
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
    message: ChatMessage = Field(default_factory=lambda: ChatMessage(role="assistant"))
    finish_reason: str | None = None


class Usage(_Base):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None  # RSIGym extension: what the call was charged


class ChatCompletion(GymObject):
    id: str | None = None  # providers behind the gateway may omit id / created
    object: str = "chat.completion"
    created: int | None = None
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
    """One ``data:`` event of a streamed chat completion (metadata lives on the stream).

    With ``stream_options={"include_usage": True}`` the last chunk has no choices and
    carries ``usage`` (with ``cost_usd``) instead.
    """

    id: str | None = None
    object: str = "chat.completion.chunk"
    created: int | None = None
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


class ChildKey(HasRequestMeta, _WithMeta):
    """A key minted from the run's key, with its own (sub-)budget and policy.

    ``key`` holds the plaintext secret only in the answer to ``keys.mint()``; the
    gateway stores it hashed and never shows it again. It is kept out of ``repr()``.
    ``remaining_usd`` is the key's own remaining budget when the gateway reports it
    (a field, like :class:`Balance`'s, not the response header).
    """

    id: str
    key: str | None = Field(default=None, repr=False)
    name: str | None = None
    prefix: str | None = None
    parent_id: str | None = None
    run_id: str | None = None
    track: str | None = None
    status: str | None = None
    budget_usd: float | None = None
    policy: dict[str, Any] | None = None
    spent_usd: float | None = None
    reserved_usd: float | None = None
    remaining_usd: float | None = None
    created_at: datetime | None = None


class Dataset(HasRequestMeta, _WithMeta):
    """An uploaded dataset (content-addressed; identical content is stored once)."""

    id: str
    object: str = "dataset"
    name: str | None = None
    sha256: str
    format: str
    rows: int
    bytes: int
    created_at: str | None = None


class TrainingStepMetrics(_Base):
    step: int
    loss: float
    lr: float
    tokens: int
    grad_norm: float
    cost_usd: float
    cumulative_cost_usd: float


class TrainingJob(_WithMeta):
    """A training job; ``cost_usd`` is what its steps have cost so far."""

    id: str
    object: str = "training.job"
    status: str
    base_model: str
    parent_checkpoint: str | None = None
    datasets: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    step: int = 0
    total_steps: int = 0
    cost_usd: float = 0.0
    error: str | None = None
    metrics: list[TrainingStepMetrics] | None = None
    checkpoints: list[str] | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled", "budget_exhausted")


class Checkpoint(HasRequestMeta, _WithMeta):
    id: str
    object: str = "checkpoint"
    job_id: str
    base_model: str
    parent_checkpoint: str | None = None
    dataset_hashes: list[str] = Field(default_factory=list)
    config_hash: str
    loss_module_hash: str | None = None
    step: int
    metrics: dict[str, Any] = Field(default_factory=dict)
    weights_hash: str
    created_at: str | None = None
