"""Request bodies of the records service: new experiments and the agent's annotations.

Annotations are the agent's claims, kept apart from platform facts, so each kind has a
strict shape (``extra="forbid"``): a review is a review, not free text. The gateway canonicalises
bodies against :class:`AnnotationEnvelope` (every field any kind may carry); the service then
validates the body against the one model its ``kind`` names.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

ANNOTATION_KINDS = ("hypothesis", "finding", "review", "decision")
MAX_ITEMS = 100
"""Most entries in one list of an annotation (ids, review points)."""

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4000)]
Id = Annotated[str, StringConstraints(min_length=1, max_length=40)]
Ids = Annotated[list[Id], Field(max_length=MAX_ITEMS)]
Points = Annotated[list[Text], Field(max_length=MAX_ITEMS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExperimentRequest(_Strict):
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    parents: Ids = Field(default_factory=list)
    """Experiments of this run that the new one continues."""
    note: Text | None = None
    """Free text kept with the experiment (stored as a ``note`` annotation by its owner)."""


class Hypothesis(_Strict):
    kind: Literal["hypothesis"]
    statement: Text
    rationale: Text | None = None
    experiment_ids: Ids = Field(default_factory=list)


class Finding(_Strict):
    kind: Literal["finding"]
    claim: Text
    experiment_ids: Annotated[list[Id], Field(min_length=1, max_length=MAX_ITEMS)]
    """The evidence: experiments the writer may read (checked by the service)."""
    metric: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    value: float | None = Field(default=None, allow_inf_nan=False)


class Review(_Strict):
    kind: Literal["review"]
    experiment_ids: Annotated[list[Id], Field(min_length=1, max_length=MAX_ITEMS)]
    findings_supported: Points = Field(default_factory=list)
    uncertainties: Points = Field(default_factory=list)
    suspected_protocol_violations: Points = Field(default_factory=list)
    regressions: Points = Field(default_factory=list)
    missing_comparisons: Points = Field(default_factory=list)
    suggested_next_experiments: Points = Field(default_factory=list)


class Decision(_Strict):
    """What a research lead decided on the evidence (RSI-Master's Main agent): go on with a
    direction, verify a result, branch into new directions, revise one, or stop. The research
    graph's edges: ``experiment_ids`` is the evidence reacted to, ``directions`` what comes next."""

    kind: Literal["decision"]
    action: Literal["continue", "verify", "branch", "revise", "stop"]
    rationale: Text
    experiment_ids: Ids = Field(default_factory=list)
    directions: Points = Field(default_factory=list)
    reacts_to: Ids = Field(default_factory=list)
    """Annotations (a worker's finding, a review) the decision answers; ids the writer may read."""


ANNOTATION_MODELS: dict[str, type[Hypothesis | Finding | Review | Decision]] = {
    "hypothesis": Hypothesis, "finding": Finding, "review": Review, "decision": Decision,
}


class AnnotationEnvelope(BaseModel):
    """Every field an annotation of any kind may carry (the gateway's spelling table); the
    service checks the body against the model of its ``kind``."""

    model_config = ConfigDict(extra="allow")

    kind: str
    statement: str | None = None
    rationale: str | None = None
    claim: str | None = None
    metric: str | None = None
    value: float | None = None
    experiment_ids: list[str] | None = None
    findings_supported: list[str] | None = None
    uncertainties: list[str] | None = None
    suspected_protocol_violations: list[str] | None = None
    regressions: list[str] | None = None
    missing_comparisons: list[str] | None = None
    suggested_next_experiments: list[str] | None = None
    action: str | None = None
    directions: list[str] | None = None
    reacts_to: list[str] | None = None
