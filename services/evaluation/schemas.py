"""Request bodies of the evaluation service."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MINIMAL = "minimal"
"""The harness every gym ships (services/evaluation/harnesses.py); the default of a job."""
INITIAL_RUN = "initial"
"""The run id of the initial system's scores (the run's base model, minimal harness)."""
REFERENCE_RUN = "reference"
"""The run id of a reference system's scores (a named base model, minimal harness): shown next
to the initial system ("gap to reference"), never part of the RSI-Index."""
BASELINE_RUNS = (INITIAL_RUN, REFERENCE_RUN)


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
    subset: int | None = Field(default=None, ge=1)
    """Score this many tasks of the split, drawn by ``subset_seed`` (services/evaluation/subsets.py);
    the initial and reference systems are scored on the same tasks. Default: the whole split."""
    subset_seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    """The seed of the subset draw: required with ``subset`` (and only with it), so every report
    names the seed that chose its tasks."""
    reference: str | None = Field(default=None, max_length=200)
    """A base model of the gym scored with the minimal harness next to the initial system (the
    "gap to reference", e.g. the Instruct model); never part of the RSI-Index."""
    decompose: bool = False
    """Also score the submitted model with the minimal harness and the base model with the
    submitted harness on the same scope (the 2×2 of model × harness: services/evaluation/decompose.py);
    nothing more is scored when the submission kept the base model or the minimal harness."""
