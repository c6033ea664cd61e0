"""Who may read which records: the security core of the records service.

* A run (root) key reads its whole run.
* A child key reads the experiments owned by keys of its own subtree and of the subtrees of
  the keys its records policy names as ``owners`` (a reviewer names the workers it reviews),
  plus every predecessor of those experiments (ancestors via edges: a worker sees what it
  continues); the events caused by those keys or attached to those experiments; and the
  annotations written by those keys or about visible experiments only.
* Nothing of another run is ever visible. Whatever is invisible answers 404 exactly like
  what does not exist, so ids of other keys' records leak nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, false, or_, select
from sqlalchemy.orm import Session

from access.keys import readable_keys
from kit.errors import NotFound
from kit.identity import Identity
from services.records.events import RecordEvent
from services.records.experiments import Experiment, ExperimentEdge
from services.records.tables import Annotation
from storage.tables import ApiKey


@dataclass(frozen=True)
class Scope:
    """What one caller may read of one run. ``keys``/``experiments`` None: the whole run."""

    run_id: str
    keys: frozenset[str] | None
    experiments: frozenset[str] | None

    @property
    def whole_run(self) -> bool:
        return self.keys is None

    def sees_experiment_id(self, experiment_id: str | None) -> bool:
        return self.experiments is None or (experiment_id is not None and experiment_id in self.experiments)

    def sees_annotation(self, a: Annotation) -> bool:
        if a.run_id != self.run_id:
            return False
        if self.keys is None or a.key_id in self.keys:
            return True
        return bool(a.experiment_ids) and all(self.sees_experiment_id(x) for x in a.experiment_ids)

    def event_filter(self) -> ColumnElement[bool]:
        """SQL condition on :class:`RecordEvent` (besides ``run_id``) for the visible events."""
        if self.keys is None or self.experiments is None:
            return RecordEvent.run_id == self.run_id
        conditions: list[ColumnElement[bool]] = []
        if self.keys:
            conditions.append(RecordEvent.key_id.in_(self.keys))
        if self.experiments:
            conditions.append(RecordEvent.experiment_id.in_(self.experiments))
        return or_(*conditions) if conditions else false()

    def experiment_filter(self) -> ColumnElement[bool]:
        if self.experiments is None:
            return Experiment.run_id == self.run_id
        return Experiment.id.in_(self.experiments) if self.experiments else false()

    def experiment(self, s: Session, experiment_id: Any, *, param: str = "id") -> Experiment:
        """The visible experiment, or the same 404 for missing, another run's and invisible ones."""
        row = s.get(Experiment, experiment_id) if isinstance(experiment_id, str) else None
        if row is None or row.run_id != self.run_id or not self.sees_experiment_id(row.id):
            raise NotFound(f"experiment {experiment_id} not found", param=param)
        return row


def ancestors(s: Session, experiment_ids: Iterable[str]) -> set[str]:
    """``experiment_ids`` and every experiment they continue, transitively."""
    found = set(experiment_ids)
    frontier = set(found)
    while frontier:
        parents = set(s.scalars(select(ExperimentEdge.parent_id).where(ExperimentEdge.child_id.in_(frontier))))
        frontier = parents - found
        found |= frontier
    return found


def run_scope(run_id: str) -> Scope:
    """The whole of one run (its root key, or the operator)."""
    return Scope(run_id=run_id, keys=None, experiments=None)


def scope_of(s: Session, identity: Identity) -> Scope:
    """What the calling key may read (see the module doc)."""
    key = s.get(ApiKey, identity.key_id)
    if key is None or key.root_id != identity.run_id:  # the gateway authenticated it: cannot happen
        raise NotFound("key not found")
    keys = readable_keys(s, key)
    if keys is None:
        return run_scope(identity.run_id)
    owned = s.scalars(select(Experiment.id).where(Experiment.run_id == identity.run_id,
                                                  Experiment.owner_key_id.in_(keys)))
    visible = {x for x in ancestors(s, owned)}
    # Edges are made within a run only; the run filter keeps that a property of this module too.
    if visible:
        visible = set(s.scalars(select(Experiment.id).where(Experiment.id.in_(visible),
                                                            Experiment.run_id == identity.run_id)))
    return Scope(run_id=identity.run_id, keys=frozenset(keys), experiments=frozenset(visible))
