"""Whose failure a failed trial is (services/evaluation/failures.py), and what a job's score makes
of each kind (services/evaluation/jobs.py): only the agent's own failures are its zeros."""

from __future__ import annotations

import httpx
import pytest
from e2b.exceptions import SandboxException, SandboxUnreachableException

from kit.errors import ServiceUnavailable, StoreUnavailable, UpstreamError
from services.evaluation.failures import classify_error, classify_failure, failure_kind
from services.evaluation.jobs import job_score


@pytest.mark.parametrize("exc", [
    httpx.ConnectError("All connection attempts failed"), httpx.ReadTimeout("timed out"),
    httpx.RemoteProtocolError("Server disconnected without sending a response."),
    ServiceUnavailable("the sandbox service is down"), UpstreamError("bad gateway"), StoreUnavailable("no store"),
    SandboxException("boom"), SandboxUnreachableException("gone"), ConnectionRefusedError(111, "refused"),
])
def test_connection_and_service_errors_are_the_platforms_in_every_phase(exc: Exception) -> None:
    for phase in ("prepare", "agent", "verify"):
        assert classify_failure(type(exc).__name__, str(exc), phase) == "platform", (exc, phase)


@pytest.mark.parametrize(("error", "kind"), [
    # the gym's environment: a sandbox refused or never prepared, a gateway answering 5xx
    ("RuntimeError: the sandbox service refused to create a sandbox: HTTP 503: store unavailable", "platform"),
    ("RuntimeError: the sandbox service refused to create a sandbox: HTTP 402: budget exhausted", "platform"),
    ("RuntimeError: could not prepare the sandbox: mkdir failed", "platform"),
    ("RuntimeError: HTTP 502: upstream error", "platform"),
    ("EnvironmentStartTimeoutError: the environment did not start in 300 s", "platform"),
    ("SandboxBuildFailedError: Dockerfile needs RUN pip install numpy", "platform"),
    ("ValueError: task t1: Harbor refuses its task.toml", "platform"),
    # the verifier gave no reward
    ("VerifierTimeoutError: verifier timed out after 600 s", "verifier"),
    ("RewardFileNotFoundError: /logs/verifier/reward.txt", "verifier"),
    ("RewardFileEmptyError: reward file is empty", "verifier"),
    ("the verifier produced no reward", "verifier"),
    # the harness's own failures
    ("AgentTimeoutError: Agent execution timed out after 1.0 seconds", "agent"),
    ("AgentSetupTimeoutError: Agent setup timed out", "agent"),
    ("RuntimeError: harness install exited with code 3: oops", "agent"),
    ("ValueError: /h/harness.toml: [harness] run is required", "agent"),
])
def test_recorded_errors_name_their_kind(error: str, kind: str) -> None:
    assert classify_error(error) == kind
    assert failure_kind(None, error, None) == kind  # a row with no stored kind is read from its error


def test_an_unknown_exception_leans_by_phase_and_outside_the_harness_is_the_platforms() -> None:
    """Nothing the harness did can break the gym before it runs: an unknown failure there (or in
    the worker) is the platform's, never a zero; while the harness ran it is the harness's; while
    verifying, the verifier's."""
    assert classify_failure("KeyError", "'sandboxID'", "prepare") == "platform"
    assert classify_failure("KeyError", "'sandboxID'", "agent") == "agent"
    assert classify_failure("KeyError", "'sandboxID'", "verify") == "verifier"
    assert classify_error("something odd happened") == "platform"


def test_a_stored_kind_wins_and_a_trial_that_did_not_fail_has_none() -> None:
    assert failure_kind(None, "ConnectError: refused", "agent") == "agent"
    assert failure_kind(1.0, None, None) is None
    assert failure_kind(0.0, "AgentTimeoutError: late", None) == "agent"  # timed out, then verified 0
    assert failure_kind(None, None, None) == "verifier"  # no error, no reward: never judged


def test_job_score_counts_agent_zeros_but_never_scores_an_unscored_trial() -> None:
    assert job_score({"t1": [1.0, 0.0], "t2": [1.0, 1.0]}) == pytest.approx(0.75)
    assert job_score({"t1": [1.0, None], "t2": [1.0, 1.0]}) is None  # a platform failure: no score, not 0.75
    assert job_score({"t1": [None], "t2": [None]}) is None  # everything failed to connect: not 0.0
    assert job_score({}) is None
