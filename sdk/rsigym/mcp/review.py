"""``review_*``: a reviewer's structured review of experiments and a research lead's decision on it
— the edges of the research graph. Both are the agent's own annotations; writing them is free."""

from __future__ import annotations

from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from pydantic import Field

from .._client import Gym
from ._tools import Result, ToolRegistrar, dump

__all__ = ["register"]

Points = Annotated[list[str] | None, Field(description="one point per item")]


def register(server: MCPServer, gym: Gym) -> None:
    tool = ToolRegistrar(server, "review")

    @tool("record_review", "Record a review of experiments: findings supported, uncertainties, suspected protocol "
          "violations, regressions, missing comparisons, next experiments (free).")
    def record_review(
        experiment_ids: Annotated[list[str], Field(description="the experiments reviewed")],
        findings_supported: Points = None,
        uncertainties: Points = None,
        suspected_protocol_violations: Points = None,
        regressions: Points = None,
        missing_comparisons: Points = None,
        suggested_next_experiments: Points = None,
    ) -> Result:
        return dump(gym.records.annotations.review(
            experiment_ids, findings_supported=findings_supported, uncertainties=uncertainties,
            suspected_protocol_violations=suspected_protocol_violations, regressions=regressions,
            missing_comparisons=missing_comparisons, suggested_next_experiments=suggested_next_experiments))

    @tool("record_decision", "Record a decision (continue, verify, branch, revise or stop) on experiments and the "
          "findings or reviews it reacts to, opening new directions (free).")
    def record_decision(
        action: Annotated[str, Field(description="continue | verify | branch | revise | stop")],
        rationale: str,
        experiment_ids: Annotated[list[str] | None, Field(description="the evidence")] = None,
        directions: Annotated[list[str] | None, Field(description="directions it opens")] = None,
        reacts_to: Annotated[list[str] | None, Field(description="annotation ids (a finding, a review)")] = None,
    ) -> Result:
        return dump(gym.records.annotations.decision(action, rationale, experiment_ids=experiment_ids,
                                                     directions=directions, reacts_to=reacts_to))

    @tool("list", "List the reviews or the decisions recorded, optionally about one experiment (free).",
          read_only=True)
    def list_reviews(kind: Literal["review", "decision"] = "review", experiment: str | None = None) -> Result:
        return dump(gym.records.annotations.list(kind=kind, experiment=experiment))
