"""A run's lifecycle state from its facts (access/lifecycle.py): the one derivation every view shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from access.lifecycle import exit_reason, run_state

NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(("code", "reason"), [
    (0, "finished"), (124, "deadline"), (1, "crashed"), (-9, "crashed"), (127, "failed_to_start"),
    (126, "failed_to_start"), (125, "failed_to_start"), (None, "failed_to_start"),
])
def test_an_agent_exit_names_why_the_run_ended(code: int | None, reason: str) -> None:
    assert exit_reason(code) == reason


def test_states_from_running_to_scored() -> None:
    later, earlier = NOW + timedelta(hours=1), NOW - timedelta(seconds=1)
    assert str(run_state(key_status="active", ends_at=later, now=NOW)) == "running"
    assert str(run_state(key_status="paused", ends_at=later, now=NOW)) == "paused"
    assert str(run_state(key_status="active", ends_at=earlier, now=NOW)) == "ended (deadline)"
    assert str(run_state(key_status="paused", ends_at=earlier, now=NOW)) == "ended (deadline)"
    assert str(run_state(key_status="revoked", ends_at=None, now=NOW)) == "ended (revoked)"
    assert str(run_state(key_status="active", ends_at=earlier, end_reason="crashed", now=NOW)) == "ended (crashed)"
    assert str(run_state(key_status="active", ends_at=earlier, end_reason="crashed", audited=True,
                         now=NOW)) == "audited (crashed)"
    assert str(run_state(key_status="active", ends_at=earlier, end_reason="finished", audited=True, scored=True,
                         now=NOW)) == "scored (finished)"
    # audits and scores of a run still open do not end it
    assert str(run_state(key_status="active", ends_at=later, audited=True, scored=True, now=NOW)) == "running"
