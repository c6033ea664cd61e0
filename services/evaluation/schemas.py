"""Request bodies of the evaluation service."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MINIMAL = "minimal"
"""The harness every gym ships (services/evaluation/harnesses.py); the default of a job."""


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=0.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=64, ge=1, le=4096)
    seed: int | None = None


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    benchmark: str
    split: str = "dev"
    model: str
    harness: str = MINIMAL
    attempts: int = Field(default=1, ge=1, le=10)
    sampling: Sampling = Field(default_factory=Sampling)
    tasks: list[str] | None = Field(default=None, max_length=10_000)
    """A subset of the split's task ids (default: all)."""
    limit: int | None = Field(default=None, ge=1)
    """At most this many tasks (the first, in the split's order)."""
    experiment: str | None = Field(default=None, max_length=40)
    """The caller's own experiment to attach the evaluation to (default: the evaluated
    checkpoint's experiment when the caller owns it, else a new implicit one)."""


class SubmissionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = None
    harness: str | None = None
    base_model: str | None = None


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(default=3, ge=1, le=10)
    benchmarks: list[str] | None = None
    split: str = "official"
    submission_id: str | None = Field(default=None, max_length=40)
    """The submission the operator audited: scoring is refused (409) unless it is the run's
    final one (services/evaluation/submissions.py)."""
