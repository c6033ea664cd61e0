"""``evidence_*``: the run's research record — experiments, their diffs and lineage, the agent's
hypotheses and findings, the platform's events, the best accepted checkpoint, and the money.

Reading the record and writing annotations cost nothing; the platform writes events itself.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

from .._client import Gym
from ._tools import Result, ToolRegistrar, dump

__all__ = ["register"]

ExperimentId = Annotated[str, Field(description="an experiment id (exp_…)")]
ExperimentIds = Annotated[list[str], Field(description="experiment ids (exp_…)")]


def register(server: MCPServer, gym: Gym) -> None:
    tool = ToolRegistrar(server, "evidence")

    @tool("create_experiment", "Open a new experiment (a node of the research graph) continuing parent experiments; "
          "attach training and evaluation jobs to it by its id (free).")
    def create_experiment(
        name: str,
        note: Annotated[str | None, Field(description="what you try and why")] = None,
        parents: Annotated[list[str] | None, Field(description="experiment ids it continues")] = None,
    ) -> Result:
        return dump(gym.records.experiments.create(name, parents=parents, note=note))

    @tool("list_experiments", "List the experiments this key may read: status, parents, checkpoints, scores (free).",
          read_only=True)
    def list_experiments() -> Result:
        return dump(gym.records.experiments.list())

    @tool("get_experiment", "Show one experiment with its platform events and the annotations about it (free).",
          read_only=True)
    def get_experiment(experiment_id: ExperimentId) -> Result:
        return dump(gym.records.experiments.get(experiment_id))

    @tool("diff_experiments", "Compare experiment b with a: config fields, datasets added/removed, score deltas "
          "(free).", read_only=True)
    def diff_experiments(a: ExperimentId, b: ExperimentId) -> Result:
        return dump(gym.records.experiments.diff(a, b))

    @tool("lineage", "Trace a checkpoint back to its base model: each link's job, config, datasets, hashes (free).",
          read_only=True)
    def lineage(checkpoint_id: Annotated[str, Field(description="a checkpoint id (ckpt_…)")]) -> Result:
        return dump(gym.records.lineage(checkpoint_id))

    @tool("best_checkpoint", "The highest-scoring checkpoint on a split among accepted and not yet audited "
          "experiments, marked audit=accepted|unaudited (free).",
          read_only=True)
    def best_checkpoint(benchmark: str | None = None, split: str = "dev") -> Result:
        return dump(gym.records.best_checkpoint(benchmark=benchmark, split=split))

    @tool("add_hypothesis", "Record a hypothesis (your own labelled claim, kept apart from platform events; free).")
    def add_hypothesis(
        statement: str,
        rationale: str | None = None,
        experiment_ids: Annotated[list[str] | None, Field(description="experiments it is about")] = None,
    ) -> Result:
        return dump(gym.records.annotations.hypothesis(statement, rationale=rationale, experiment_ids=experiment_ids))

    @tool("add_finding", "Record a finding backed by experiments as evidence, optionally with a metric and value "
          "(free).")
    def add_finding(claim: str, experiment_ids: ExperimentIds, metric: str | None = None,
                    value: float | None = None) -> Result:
        return dump(gym.records.annotations.finding(claim, experiment_ids=experiment_ids, metric=metric, value=value))

    @tool("list_annotations", "List hypotheses, findings, reviews and decisions, by kind or experiment (free).",
          read_only=True)
    def list_annotations(kind: str | None = None, experiment: str | None = None) -> Result:
        return dump(gym.records.annotations.list(kind=kind, experiment=experiment))

    @tool("list_events", "Page through the platform's events of the run (jobs, evaluations, sandboxes, refusals); "
          "pass the last seq as after for the next page (free).", read_only=True)
    def list_events(kind: str | None = None, experiment: str | None = None, after: int | None = None,
                    limit: Annotated[int | None, Field(ge=1, le=1000)] = None) -> Result:
        return dump(gym.records.events(kind=kind, experiment=experiment, after=after, limit=limit))

    @tool("verify_chain", "Verify the run's hash-chained event record is intact (free).", read_only=True)
    def verify_chain() -> Result:
        return dump(gym.records.chain())

    @tool("balance", "The run's budget: total, spent, reserved and remaining USD (free).", read_only=True)
    def balance() -> Result:
        return dump(gym.balance())
