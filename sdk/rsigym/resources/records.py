"""``gym.records``: the run's record (the Experiment OS) — platform events, experiments, lineage,
the best accepted checkpoint, and the agent's own annotations.

::

    exp = gym.records.experiments.create("lr sweep 3e-4", parents=[prev.id], note="halve the lr")
    job = gym.training.create_job(..., experiment=exp.id)         # actions attach to your experiment
    gym.records.experiments.get(exp.id).evaluations               # scores, from platform events
    gym.records.experiments.diff(prev.id, exp.id).scores          # per benchmark/split, a vs b
    gym.records.lineage("ckpt_…").links                           # ckpt → parent → … → base model
    gym.records.best_checkpoint(benchmark="arithmetic")           # highest dev score, accepted or unaudited
    gym.records.annotations.finding("lr 3e-4 beats 1e-4", experiment_ids=[exp.id], metric="dev", value=0.61)
    for e in gym.records.events(kind="training.job"): print(e.seq, e.data["status"])
    assert gym.records.chain().ok

Events are the platform's, never the agent's: there is no call that writes one. A child key
reads only its own experiments and their predecessors, plus those of the keys its policy names
as ``owners`` (a reviewer); anything else answers :class:`~rsigym.NotFoundError`.
"""

from __future__ import annotations

from typing import Any

from .._base_client import APICall
from .._response import ObjectList, parse_list, parse_object
from ..types import Annotation, BestCheckpoint, ChainReport, Experiment, ExperimentDiff, Lineage, RecordEvent
from ._resource import AsyncResource, SyncResource, drop_none, path_id

__all__ = ["Records", "AsyncRecords"]

_BASE = "/records/v1"


def events_call(kind: str | None, experiment: str | None, after: int | None,
                limit: int | None) -> APICall[ObjectList[RecordEvent]]:
    params = drop_none({"kind": kind, "experiment": experiment, "after": after, "limit": limit})
    return APICall("GET", f"{_BASE}/events", parse_list(RecordEvent), params=params)


def experiments_call() -> APICall[ObjectList[Experiment]]:
    return APICall("GET", f"{_BASE}/experiments", parse_list(Experiment))


def create_experiment_call(name: str, parents: list[str] | None, note: str | None) -> APICall[Experiment]:
    body = drop_none({"name": name, "parents": list(parents or []), "note": note})
    return APICall("POST", f"{_BASE}/experiments", parse_object(Experiment), json=body)


def experiment_call(experiment_id: str) -> APICall[Experiment]:
    return APICall("GET", f"{_BASE}/experiments/{path_id(experiment_id)}", parse_object(Experiment))


def diff_call(a: str, b: str) -> APICall[ExperimentDiff]:
    return APICall("GET", f"{_BASE}/experiments/{path_id(a)}/diff/{path_id(b)}", parse_object(ExperimentDiff))


def lineage_call(checkpoint_id: str) -> APICall[Lineage]:
    return APICall("GET", f"{_BASE}/checkpoints/{path_id(checkpoint_id)}/lineage", parse_object(Lineage))


def best_call(benchmark: str | None, split: str, audited: bool = False) -> APICall[BestCheckpoint]:
    return APICall("GET", f"{_BASE}/best-checkpoint", parse_object(BestCheckpoint),
                   params=drop_none({"benchmark": benchmark, "split": split, "audited": "true" if audited else None}))


def annotate_call(body: dict[str, Any]) -> APICall[Annotation]:
    return APICall("POST", f"{_BASE}/annotations", parse_object(Annotation), json=body)


def annotations_call(kind: str | None, experiment: str | None) -> APICall[ObjectList[Annotation]]:
    return APICall("GET", f"{_BASE}/annotations", parse_list(Annotation),
                   params=drop_none({"kind": kind, "experiment": experiment}))


def chain_call() -> APICall[ChainReport]:
    return APICall("GET", f"{_BASE}/chain", parse_object(ChainReport))


def hypothesis_body(statement: str, rationale: str | None, experiment_ids: list[str] | None) -> dict[str, Any]:
    return drop_none({"kind": "hypothesis", "statement": statement, "rationale": rationale,
                      "experiment_ids": list(experiment_ids) if experiment_ids is not None else None})


def finding_body(claim: str, experiment_ids: list[str], metric: str | None, value: float | None) -> dict[str, Any]:
    return drop_none({"kind": "finding", "claim": claim, "experiment_ids": list(experiment_ids), "metric": metric,
                      "value": value})


def review_body(experiment_ids: list[str], points: dict[str, list[str] | None]) -> dict[str, Any]:
    return {"kind": "review", "experiment_ids": list(experiment_ids),
            **{name: list(value) for name, value in points.items() if value is not None}}


def decision_body(action: str, rationale: str, experiment_ids: list[str] | None, directions: list[str] | None,
                  reacts_to: list[str] | None) -> dict[str, Any]:
    return drop_none({"kind": "decision", "action": action, "rationale": rationale,
                      "experiment_ids": list(experiment_ids) if experiment_ids is not None else None,
                      "directions": list(directions) if directions is not None else None,
                      "reacts_to": list(reacts_to) if reacts_to is not None else None})


# ---- resources ----------------------------------------------------------------------------


class Experiments(SyncResource):
    def create(self, name: str, *, parents: list[str] | None = None, note: str | None = None) -> Experiment:
        """A new experiment owned by this key, continuing ``parents`` (experiments you may read)."""
        return self._client._request(create_experiment_call(name, parents, note))

    def list(self) -> ObjectList[Experiment]:
        """The experiments this key may read, oldest first."""
        return self._client._request(experiments_call())

    def get(self, experiment_id: str) -> Experiment:
        """One experiment with its events and the annotations about it."""
        return self._client._request(experiment_call(experiment_id))

    def diff(self, a: str, b: str) -> ExperimentDiff:
        """Config, data and scores of ``b`` against ``a``."""
        return self._client._request(diff_call(a, b))


class Annotations(SyncResource):
    def hypothesis(self, statement: str, *, rationale: str | None = None,
                   experiment_ids: list[str] | None = None) -> Annotation:
        return self._client._request(annotate_call(hypothesis_body(statement, rationale, experiment_ids)))

    def finding(self, claim: str, *, experiment_ids: list[str], metric: str | None = None,
                value: float | None = None) -> Annotation:
        """A claimed finding; ``experiment_ids`` (non-empty) are its evidence."""
        return self._client._request(annotate_call(finding_body(claim, experiment_ids, metric, value)))

    def review(self, experiment_ids: list[str], *, findings_supported: list[str] | None = None,
               uncertainties: list[str] | None = None, suspected_protocol_violations: list[str] | None = None,
               regressions: list[str] | None = None, missing_comparisons: list[str] | None = None,
               suggested_next_experiments: list[str] | None = None) -> Annotation:
        points = {"findings_supported": findings_supported, "uncertainties": uncertainties,
                  "suspected_protocol_violations": suspected_protocol_violations, "regressions": regressions,
                  "missing_comparisons": missing_comparisons, "suggested_next_experiments": suggested_next_experiments}
        return self._client._request(annotate_call(review_body(experiment_ids, points)))

    def decision(self, action: str, rationale: str, *, experiment_ids: list[str] | None = None,
                 directions: list[str] | None = None, reacts_to: list[str] | None = None) -> Annotation:
        """A research lead's decision (``continue | verify | branch | revise | stop``) on the evidence
        in ``experiment_ids`` and the annotations in ``reacts_to`` (a finding, a review), opening
        ``directions``: the edges of the research graph."""
        return self._client._request(annotate_call(decision_body(action, rationale, experiment_ids, directions,
                                                                 reacts_to)))

    def create(self, body: dict[str, Any]) -> Annotation:
        """Any annotation as a JSON object with its ``kind`` (what ``gym records annotate`` sends)."""
        return self._client._request(annotate_call(dict(body)))

    def list(self, *, kind: str | None = None, experiment: str | None = None) -> ObjectList[Annotation]:
        return self._client._request(annotations_call(kind, experiment))


class Records(SyncResource):
    experiments: Experiments
    annotations: Annotations

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.experiments = Experiments(client)
        self.annotations = Annotations(client)

    def events(self, *, kind: str | None = None, experiment: str | None = None, after: int | None = None,
               limit: int | None = None) -> ObjectList[RecordEvent]:
        """One page of the platform events this key may read, by sequence number: pass the last
        event's ``seq`` as ``after`` for the next page (``limit``: at most 1000, default 100)."""
        return self._client._request(events_call(kind, experiment, after, limit))

    def lineage(self, checkpoint_id: str) -> Lineage:
        return self._client._request(lineage_call(checkpoint_id))

    def best_checkpoint(self, *, benchmark: str | None = None, split: str = "dev",
                        audited: bool = False) -> BestCheckpoint:
        """The highest-scoring checkpoint on ``split`` among ``accepted`` and not yet audited
        experiments (``audit``: ``accepted`` or ``unaudited``; ``audited=True``: accepted ones
        only), never flagged ones (:class:`~rsigym.NotFoundError` when there is none yet)."""
        return self._client._request(best_call(benchmark, split, audited))

    def chain(self) -> ChainReport:
        return self._client._request(chain_call())


class AsyncExperiments(AsyncResource):
    async def create(self, name: str, *, parents: list[str] | None = None, note: str | None = None) -> Experiment:
        return await self._client._request(create_experiment_call(name, parents, note))

    async def list(self) -> ObjectList[Experiment]:
        return await self._client._request(experiments_call())

    async def get(self, experiment_id: str) -> Experiment:
        return await self._client._request(experiment_call(experiment_id))

    async def diff(self, a: str, b: str) -> ExperimentDiff:
        return await self._client._request(diff_call(a, b))


class AsyncAnnotations(AsyncResource):
    async def hypothesis(self, statement: str, *, rationale: str | None = None,
                         experiment_ids: list[str] | None = None) -> Annotation:
        return await self._client._request(annotate_call(hypothesis_body(statement, rationale, experiment_ids)))

    async def finding(self, claim: str, *, experiment_ids: list[str], metric: str | None = None,
                      value: float | None = None) -> Annotation:
        return await self._client._request(annotate_call(finding_body(claim, experiment_ids, metric, value)))

    async def review(self, experiment_ids: list[str], *, findings_supported: list[str] | None = None,
                     uncertainties: list[str] | None = None, suspected_protocol_violations: list[str] | None = None,
                     regressions: list[str] | None = None, missing_comparisons: list[str] | None = None,
                     suggested_next_experiments: list[str] | None = None) -> Annotation:
        points = {"findings_supported": findings_supported, "uncertainties": uncertainties,
                  "suspected_protocol_violations": suspected_protocol_violations, "regressions": regressions,
                  "missing_comparisons": missing_comparisons, "suggested_next_experiments": suggested_next_experiments}
        return await self._client._request(annotate_call(review_body(experiment_ids, points)))

    async def decision(self, action: str, rationale: str, *, experiment_ids: list[str] | None = None,
                       directions: list[str] | None = None, reacts_to: list[str] | None = None) -> Annotation:
        return await self._client._request(annotate_call(decision_body(action, rationale, experiment_ids, directions,
                                                                       reacts_to)))

    async def create(self, body: dict[str, Any]) -> Annotation:
        return await self._client._request(annotate_call(dict(body)))

    async def list(self, *, kind: str | None = None, experiment: str | None = None) -> ObjectList[Annotation]:
        return await self._client._request(annotations_call(kind, experiment))


class AsyncRecords(AsyncResource):
    experiments: AsyncExperiments
    annotations: AsyncAnnotations

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.experiments = AsyncExperiments(client)
        self.annotations = AsyncAnnotations(client)

    async def events(self, *, kind: str | None = None, experiment: str | None = None, after: int | None = None,
                     limit: int | None = None) -> ObjectList[RecordEvent]:
        return await self._client._request(events_call(kind, experiment, after, limit))

    async def lineage(self, checkpoint_id: str) -> Lineage:
        return await self._client._request(lineage_call(checkpoint_id))

    async def best_checkpoint(self, *, benchmark: str | None = None, split: str = "dev",
                              audited: bool = False) -> BestCheckpoint:
        return await self._client._request(best_call(benchmark, split, audited))

    async def chain(self) -> ChainReport:
        return await self._client._request(chain_call())
