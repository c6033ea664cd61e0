"""A run's lifecycle, derived in one place from the facts the gym keeps about it.

``created → running (⇄ paused) → ended (finished | stopped | deadline | crashed | failed_to_start |
revoked) → audited → scored``. The facts: the run key's status and deadline, whether the launcher
has reported its agent started (``POST /admin/v1/keys/{id}/start``), since when it is paused, the
end the launcher recorded on it (the agent process's exit and why it ended, ``POST
/admin/v1/keys/{id}/end``), and whether the run has been audited and scored. ``rsigym run list/show``, ``keys show/list``, ``watch`` and
the dashboard all show :func:`run_state` of the same facts, so they cannot disagree.

A run whose deadline passed without a recorded end ended at its ``deadline``; a revoked run key
ended its run (``revoked``). A paused run's wall clock stands still: its deadline is not reached while
it is paused, and resuming pushes the deadline back by the pause's length (access/keys.py), so
:func:`time_left` while paused is what it was when the pause began. An ended run's unspent budget can no longer be spent: views show it as
``unspent_usd``, not as what remains to spend.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

END_REASONS = ("finished", "stopped", "deadline", "crashed", "failed_to_start", "revoked")
"""Why a run ended: its agent exited 0 / the operator stopped it / its wall clock passed / its agent
exited otherwise / its agent never ran / its key was revoked."""
WALL_CLOCK_EXIT = 124
"""The exit the in-namespace relay (and compose's supervisor) gives an agent stopped at the wall clock."""
NOT_STARTED_EXITS = (125, 126, 127)
"""Exits that mean the agent never ran (docker's and the shell's convention: the container or
runtime did not start, the command cannot be run, the command is not found)."""


@dataclass(frozen=True)
class RunState:
    state: str
    """created | running | paused | ended | audited | scored"""
    reason: str | None = None
    """Why the run ended (one of :data:`END_REASONS`), once it has."""

    @property
    def ended(self) -> bool:
        return self.reason is not None

    def __str__(self) -> str:
        return self.state if self.reason is None else f"{self.state} ({self.reason})"


def exit_reason(exit_code: int | None) -> str:
    """Why a run ended whose agent process exited with ``exit_code`` (None: it never started)."""
    if exit_code is None or exit_code in NOT_STARTED_EXITS:
        return "failed_to_start"
    if exit_code == 0:
        return "finished"
    if exit_code == WALL_CLOCK_EXIT:
        return "deadline"
    return "crashed"


def clock_now(now: datetime | None, paused_at: datetime | None) -> datetime:
    """The instant a run's deadline is measured at: now, or when its pause began (a paused run's
    clock stands still)."""
    now = now or datetime.now(UTC)
    return min(now, paused_at) if paused_at is not None else now


def run_state(*, key_status: str, ends_at: datetime | None, end_reason: str | None = None,
              audited: bool = False, scored: bool = False, now: datetime | None = None,
              paused_at: datetime | None = None, launched: bool = False,
              started_at: datetime | None = None) -> RunState:
    """The run's state from its facts (``key_status``: active, paused or revoked; ``launched``:
    the launcher minted the key, so the run is ``created`` until ``started_at``)."""
    reason = end_reason
    if reason is None and key_status == "revoked":
        reason = "revoked"
    if reason is None and ends_at is not None and clock_now(now, paused_at) >= ends_at:
        reason = "deadline"
    if reason is not None:
        return RunState("scored" if scored else "audited" if audited else "ended", reason)
    if key_status == "paused":
        return RunState("paused")
    return RunState("created" if launched and started_at is None else "running")


def time_left(ends_at: datetime | None, paused_at: datetime | None = None,
              now: datetime | None = None) -> float | None:
    """Seconds of wall clock the run has left (None: no deadline); a paused run's stand still."""
    if ends_at is None:
        return None
    return max(0.0, (ends_at - clock_now(now, paused_at)).total_seconds())
