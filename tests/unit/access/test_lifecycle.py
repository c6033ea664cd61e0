"""A run's lifecycle state from its facts (access/lifecycle.py): the one derivation every view shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from access.lifecycle import exit_reason, run_state, time_left

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


def test_a_launched_run_is_created_until_its_agent_starts() -> None:
    later = NOW + timedelta(hours=1)
    assert str(run_state(key_status="active", ends_at=later, launched=True, now=NOW)) == "created"
    assert str(run_state(key_status="active", ends_at=later, launched=True, started_at=NOW, now=NOW)) == "running"
    assert str(run_state(key_status="active", ends_at=later, now=NOW)) == "running"  # a key minted by hand
    assert str(run_state(key_status="active", ends_at=later, launched=True, end_reason="failed_to_start",
                         now=NOW)) == "ended (failed_to_start)"


def test_a_paused_runs_clock_stands_still() -> None:
    paused_at, ends_at = NOW - timedelta(minutes=30), NOW - timedelta(minutes=10)
    # the deadline passed on the wall, not on the run's clock: it paused 20 minutes before it
    assert str(run_state(key_status="paused", ends_at=ends_at, paused_at=paused_at, now=NOW)) == "paused"
    assert time_left(ends_at, paused_at, now=NOW) == 20 * 60
    assert time_left(ends_at, paused_at, now=NOW + timedelta(days=3)) == 20 * 60
    # a pause that began after the deadline does not bring the run back
    assert str(run_state(key_status="paused", ends_at=ends_at, paused_at=NOW, now=NOW)) == "ended (deadline)"
    assert time_left(ends_at, NOW, now=NOW) == 0
    assert time_left(None, None, now=NOW) is None
    assert time_left(NOW + timedelta(seconds=90), now=NOW) == 90
