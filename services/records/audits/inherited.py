"""Lineage across runs: what a run started with ``--from`` inherited (access/generations.py).

A generation-N run's checkpoint chain runs through its granted initial checkpoint into earlier
runs' checkpoints, down to generation 0 (the base model); its submitted harness may be the granted
initial harness, which an earlier run uploaded. The provenance check (provenance.py) checks this
run's own links as before and, from the granted checkpoint down, labels each link with the run and
generation that made it: those were vouched for by the accepted audits the generations started
from. A checkpoint or harness of another run that is *not* the grant (or not of this run's chain)
still flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from access.generations import Link, chain, granted_harness, row_of
from services.evaluation.read import Harness, run_harness
from services.records.audits.context import AuditContext


@dataclass(frozen=True)
class Inheritance:
    """The run's generation row and its chain (generation 1 first, this run last)."""

    run_id: str
    generation: int
    from_run: str
    initial_model: str
    initial_harness: str
    initial_weights_hash: str | None
    base_model: str
    links: tuple[Link, ...]
    audits: dict[str, str | None]
    """Each earlier run of the chain → the accepted audit its next generation started on (the
    grant's own, recorded by ``--from``)."""

    @property
    def runs(self) -> dict[str, int]:
        """Each run of the chain → its generation."""
        return {link.run_id: link.generation for link in self.links}

    def label(self, run_id: str) -> str:
        """``inherited from run X (generation N, accepted audit …)``."""
        gen = self.runs.get(run_id)
        audit = self.audits.get(run_id)
        return (f"inherited from run {run_id} (generation {gen}, "
                f"{'accepted audit ' + audit if audit else 'no accepted audit found'})")

    def generations(self) -> list[dict[str, object]]:
        """Generation 0 (the base model, the minimal harness) to this run, as the lineage shows them."""
        out: list[dict[str, object]] = [{"generation": 0, "run_id": None, "model": self.base_model,
                                         "harness": "minimal", "audit": None}]
        for link in self.links:
            out.append({"generation": link.generation, "run_id": link.run_id, "from_run": link.from_run_id,
                        "initial_model": link.initial_model, "initial_harness": link.initial_harness,
                        "initial_weights_hash": link.initial_weights_hash, "audit": self.audits.get(link.run_id)})
        return out


def inheritance(ctx: AuditContext) -> Inheritance | None:
    """The run's inheritance, or None for a run started without ``--from`` (generation 1)."""
    with ctx.store.transaction() as s:
        row = row_of(s, ctx.run_id)
        if row is None:
            return None
        links = tuple(chain(s, ctx.run_id))
        audits: dict[str, str | None] = {link.from_run_id: link.from_audit_id for link in links if link.from_run_id}
        return Inheritance(run_id=row.run_id, generation=row.generation, from_run=row.from_run_id,
                           initial_model=row.initial_model, initial_harness=row.initial_harness,
                           initial_weights_hash=row.initial_weights_hash, base_model=row.base_model,
                           links=links, audits=audits)


def usable_harness(ctx: AuditContext, harness_id: str) -> tuple[Harness, str] | None:
    """``(harness, the run that uploaded it)``: one of this run's, or its granted initial harness
    (uploaded by an earlier run of its chain); None for anything else."""
    own = run_harness(ctx.store, ctx.run_id, harness_id)
    if own is not None:
        return own, ctx.run_id
    with ctx.store.transaction() as s:
        if not granted_harness(s, ctx.run_id, harness_id):
            return None
        runs = [link.run_id for link in chain(s, ctx.run_id)[:-1]]
    for run in reversed(runs):
        found = run_harness(ctx.store, run, harness_id)
        if found is not None:
            return found, run
    return None
