"""Generations: a run started from an earlier run's accepted system (``rsigym run start --from RUN``).

Generation 0 is the base model with the minimal harness; a run started without ``--from`` is
generation 1 and has no row; a run started from a generation-N run is generation N + 1 and has a
:class:`~storage.tables.RunGeneration` row, written in the same transaction as its run key
(access/keys.py), so a refused ``--from`` mints no key.

The row is the cross-run grant: the new run may read and use its initial checkpoint and its
initial harness (:func:`granted_checkpoint`, :func:`granted_harness`, asked by the checkpoint
registry and the harness store, services/training/checkpoints.py and
services/evaluation/harnesses.py), nothing more of the earlier run.

What the earlier run submitted, whether it was scored and how its audit judged it live in the
services' stores, which this package may not read (import-linter layers); the caller passes
:data:`AcceptedSystem`, a reader that returns the from-run's final, scored, audit-accepted
system or raises the refusal (services/records/read.py accepted_system).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from access.lifecycle import run_state
from kit.errors import Conflict, NotFound
from storage.tables import ApiKey, RunGeneration

if TYPE_CHECKING:
    from access.policy import Policy

MINIMAL_HARNESS = "minimal"


@dataclass(frozen=True)
class InitialSystem:
    """A run's accepted final submission, as the next generation starts from it."""

    submission_id: str
    model: str
    """The submitted checkpoint id, or a base model's name."""
    harness: str
    """The submitted harness id, or ``minimal``."""
    weights_hash: str | None
    """The checkpoint's weights hash (None: a base model)."""
    base_model: str
    """The base model the checkpoint descends from (the model itself for a base model)."""
    audit_id: str

    @property
    def is_checkpoint(self) -> bool:
        return self.weights_hash is not None


AcceptedSystem = Callable[[Session, str], InitialSystem]
"""``(session, from_run_id) -> InitialSystem``: the from-run's final submission if it was scored
and its latest audit accepted it; else raises (409 unscored / unaudited / flagged)."""


def _ended_run(s: Session, run_id: str) -> ApiKey:
    root = s.get(ApiKey, run_id)
    if root is None or root.parent_id is not None:
        raise NotFound(f"run {run_id} not found", param="from_run")
    state = run_state(key_status=root.status, ends_at=root.ends_at, end_reason=root.end_reason,
                      paused_at=root.paused_at, launched=root.agent is not None, started_at=root.started_at)
    if not state.ended:
        raise Conflict(f"run {run_id} has not ended (it is {state.state}): a run can start from it once it has ended, been "
                       f"audited and scored (rsigym run stop {run_id}; rsigym score {run_id})", param="from_run")
    return root


def initial_system(s: Session, from_run_id: str, accepted_system: AcceptedSystem) -> InitialSystem:
    """``from_run_id``'s accepted system: 404 for an unknown run, 409 for one still running, and
    whatever ``accepted_system`` refuses (unscored, unaudited, flagged)."""
    _ended_run(s, from_run_id)
    return accepted_system(s, from_run_id)


def start_from(s: Session, *, new_run_id: str, from_run_id: str, accepted_system: AcceptedSystem) -> RunGeneration:
    """Record that ``new_run_id`` starts from ``from_run_id``'s accepted system (in ``s``, the
    transaction that mints its run key): 404 for an unknown run, 409 for one still running, and
    whatever ``accepted_system`` refuses (unscored, unaudited, flagged)."""
    if new_run_id == from_run_id:
        raise Conflict("a run cannot start from itself", param="from_run")
    system = initial_system(s, from_run_id, accepted_system)
    parent = s.get(RunGeneration, from_run_id)
    row = RunGeneration(
        run_id=new_run_id, from_run_id=from_run_id,
        chain_root_id=parent.chain_root_id if parent is not None else from_run_id,
        generation=(parent.generation if parent is not None else 1) + 1,
        submission_id=system.submission_id, audit_id=system.audit_id, initial_model=system.model, initial_harness=system.harness,
        initial_weights_hash=system.weights_hash,
        base_model=parent.base_model if parent is not None else system.base_model,
    )
    s.add(row)
    s.flush()
    return row


def row_of(s: Session, run_id: str) -> RunGeneration | None:
    return s.get(RunGeneration, run_id)


def generation_of(s: Session, run_id: str) -> int:
    """The run's generation: 1 for a run started without ``--from``."""
    row = row_of(s, run_id)
    return row.generation if row is not None else 1


@dataclass(frozen=True)
class Link:
    """One run of a chain and the system it started from."""

    run_id: str
    generation: int
    from_run_id: str | None
    initial_model: str
    initial_harness: str
    initial_weights_hash: str | None
    submission_id: str | None
    """The from-run's submission this run started from (None for generation 1)."""
    from_audit_id: str | None = None
    """The from-run's audit that accepted that submission (None for generation 1)."""


def chain(s: Session, run_id: str) -> list[Link]:
    """The runs of ``run_id``'s chain, generation 1 first, ending with ``run_id`` itself. A
    generation-1 run's initial system is the chain's base model with the minimal harness."""
    rows: list[RunGeneration] = []
    row = row_of(s, run_id)
    while row is not None:
        rows.append(row)
        row = row_of(s, row.from_run_id)
    rows.reverse()
    if not rows:
        return [Link(run_id, 1, None, "", MINIMAL_HARNESS, None, None)]
    first = rows[0]
    links = [Link(first.chain_root_id, 1, None, first.base_model, MINIMAL_HARNESS, None, None)]
    links += [Link(r.run_id, r.generation, r.from_run_id, r.initial_model, r.initial_harness, r.initial_weights_hash,
                   r.submission_id, r.audit_id) for r in rows]
    return links


def granted_checkpoint(s: Session, run_id: str, ckpt_id: str) -> bool:
    """Is ``ckpt_id`` the initial checkpoint ``run_id`` was granted by ``--from``?"""
    row = row_of(s, run_id)
    return row is not None and row.initial_weights_hash is not None and row.initial_model == ckpt_id


def granted_harness(s: Session, run_id: str, harness_id: str) -> bool:
    """Is ``harness_id`` the initial harness ``run_id`` was granted by ``--from``?"""
    row = row_of(s, run_id)
    return row is not None and row.initial_harness != MINIMAL_HARNESS and row.initial_harness == harness_id


def generation_view(row: RunGeneration | None) -> dict[str, Any]:
    """What a run key's view shows of its generation (``keys show``, ``run show --json``)."""
    if row is None:
        return {"generation": 1, "from_run": None, "chain_root": None, "initial_system": None}
    return {"generation": row.generation, "from_run": row.from_run_id, "chain_root": row.chain_root_id,
            "initial_system": {"model": row.initial_model, "harness": row.initial_harness,
                               "weights_hash": row.initial_weights_hash, "base_model": row.base_model,
                               "submission": row.submission_id}}


def generation_views(s: Session, run_ids: set[str]) -> dict[str, dict[str, Any]]:
    """:func:`generation_view` of each of ``run_ids``."""
    rows = {r.run_id: r for r in s.scalars(select(RunGeneration).where(RunGeneration.run_id.in_(run_ids)))} \
        if run_ids else {}
    return {run_id: generation_view(rows.get(run_id)) for run_id in run_ids}


def with_initial_checkpoint(policy: Policy, system: InitialSystem) -> Policy:
    """``policy`` with a training rule that fixes ``parent_checkpoint``
    to none (the data track: training starts from the base only) now fixed to the initial
    checkpoint: the run's fixed base follows from the system it starts from."""
    from access.policy import FieldRule  # access.policy reaches the services' specs, which ask this module

    training = policy.services.get("training")
    if training is None or not system.is_checkpoint:
        return policy
    rule = training.fields.get("parent_checkpoint")
    if rule is None or rule.kind != "fixed" or rule.arg is not None:
        return policy
    fields = {**training.fields, "parent_checkpoint": FieldRule({"fixed": system.model})}
    return policy.model_copy(update={"services": {**policy.services,
                                                  "training": training.model_copy(update={"fields": fields})}})
