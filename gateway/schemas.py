"""Request bodies of the gateway's own routes (admin and agent key management)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


MAX_USD = 1_000_000.0
"""The largest budget or top-up one call may set (USD): the ledger counts nano-dollars in 64-bit
integers, so an amount beyond it would overflow the store (a 500) instead of being refused."""
MAX_DEADLINE_S = 10 * 365 * 86400.0
"""A run's wall-clock limit from now is at most ten years (either way, for ``SetDeadline``)."""


class RunFacts(_Body):
    """What a launcher records about the run a key is minted for (access/keys.py RUN_FACTS)."""

    task: str | None = Field(default=None, max_length=200)
    agent: str | None = Field(default=None, max_length=200)
    agent_version: str | None = Field(default=None, max_length=80)
    agent_model: str | None = Field(default=None, max_length=200)
    from_run: str | None = Field(default=None, max_length=40)
    """The run whose scored, audit-accepted final submission this run starts from (``rsigym run
    start --from RUN``; access/generations.py). Not a fact stored on the key: a generation row."""


class EndRun(_Body):
    """End a run now and record why (the launcher: its agent exited, never started, or was stopped)."""

    reason: str = Field(max_length=24)
    """access/lifecycle.py END_REASONS."""
    agent_exit: int | None = None
    """The agent process's exit status, when it had one."""


class CreateKey(_Body):
    track: str | None = None
    """A preset: data, harness, joint (``offline`` alone: joint + offline)."""
    offline: bool = False
    """The offline modifier on the track (no sandbox internet, one designated teacher)."""
    policy: dict[str, Any] | None = None
    budget_usd: float | None = Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)
    budget: str | None = Field(default=None, max_length=40)
    """A named budget of the track's preset (small, standard, large) instead of ``budget_usd``."""
    name: str | None = Field(default=None, max_length=200)
    deadline_s: float | None = Field(default=None, gt=0, le=MAX_DEADLINE_S, allow_inf_nan=False)
    """The run's wall-clock limit from now (seconds); or ``ends_at``."""
    ends_at: datetime | None = None
    """The run's deadline (ISO 8601 with a time zone); after it every key of the run is refused."""
    agent_budget_usd: float | None = Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)
    """The run's agent-model budget (``/agent/v1/…``, a meter apart from the service budget);
    None: the run's agent gets no model through the gym."""
    run: RunFacts | None = None
    """What the run is (its task, agent and the agent's model), recorded on the run key."""


class SetDeadline(_Body):
    """Set or move a run's deadline (``ends_at`` or ``deadline_s`` from now); neither clears it."""

    ends_at: datetime | None = None
    deadline_s: float | None = Field(default=None, ge=-MAX_DEADLINE_S, le=MAX_DEADLINE_S, allow_inf_nan=False)
    """Seconds from now; may be negative (an operator ending a run now: ``0``)."""


class MintChildKey(_Body):
    name: str | None = Field(default=None, max_length=200)
    policy: dict[str, Any] | None = None
    """Defaults to the parent's own policy."""
    budget_usd: float | None = Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)
    """Optional sub-budget; the parent's budget always applies too."""


class TopUp(_Body):
    amount_usd: float = Field(gt=0, le=MAX_USD, allow_inf_nan=False)


class EditPolicy(_Body):
    policy: dict[str, Any]
