"""Whose failure a failed trial is: the platform's, the verifier's or the agent's.

A trial that ends without a reward is not always the system under test's failure. With the
gateway address trials call back on down, every trial of an evaluation fails to connect; counting
those as the agent's zeros scored a platform outage as ``succeeded, 0.0``. So each failure carries
its kind:

* ``platform`` — nothing the harness under test did: the sandbox service or a sandbox's creation,
  the gateway unreachable or answering 5xx, the model door, the store, a worker, a trial the gym
  could not even configure. Retried; if it persists the job fails (services/evaluation/jobs.py).
* ``verifier`` — the verifier gave no reward (crashed, timed out, wrote none). Retried the same
  way: a trial that was never judged is no zero.
* ``agent`` — the harness's own failure: its install failed, it timed out, it broke while it ran.
  Scored 0, as the seeds rule.

Harbor records a trial's exception as its type's *name* and message (``TrialResult.exception_info``),
so the classification works on names, messages and the phase the trial was in. Light: no harbor
import (the read views and the jobs use it too).
"""

from __future__ import annotations

import re
from typing import Literal

FailureKind = Literal["platform", "verifier", "agent"]
Phase = Literal["prepare", "agent", "verify"]
"""Where a trial was when it failed: before the harness ran (configuring the trial, loading the
task, creating and preparing the sandbox), while the harness was set up or ran, or verifying."""

RETRIED: frozenset[FailureKind] = frozenset({"platform", "verifier"})
"""Kinds that are nobody's score: retried, and a job they persist in fails without a score."""

AGENT_TYPES = frozenset({
    "AgentTimeoutError", "AgentSetupTimeoutError",  # Harbor: the harness's run or install ran out of time
    "NonZeroAgentExitCodeError",  # Harbor's installed agents exiting non-zero
})
VERIFIER_TYPES = frozenset({
    "VerifierTimeoutError", "RewardFileNotFoundError", "RewardFileEmptyError", "VerifierOutputParseError",
})
PLATFORM_TYPES = frozenset({
    # Harbor: the environment never started or never came up healthy
    "EnvironmentStartTimeoutError", "SandboxBuildFailedError", "HealthcheckError", "AddTestsDirError",
    "DownloadVerifierDirError",
    # httpx: the gateway (or the sandbox daemon behind it) could not be reached or dropped the call
    "TransportError", "ConnectError", "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout",
    "ReadError", "WriteError", "CloseError", "RemoteProtocolError", "LocalProtocolError", "NetworkError",
    "TimeoutException", "ProxyError",
    # the gym's own kinds of "not now" (kit/errors.py)
    "ServiceUnavailable", "UpstreamError", "StoreUnavailable", "KeptConnectionLost", "UpstreamTimeout",
    # the sandbox SDK (e2b): the sandbox, its daemon or the service behind them failed
    "SandboxException", "SandboxNotFoundException", "SandboxNotRunningException",
    "SandboxUnreachableException", "GuestUnresponsiveException", "ServiceBusyException", "RateLimitException",
    "AuthenticationException", "TemplateException", "NotEnoughSpaceException",
    # the worker itself
    "ConnectionError", "ConnectionRefusedError", "ConnectionResetError", "BrokenPipeError", "MemoryError",
})
AGENT_MARKERS = ("harness install exited with code", "harness.toml")
"""Messages of the gym's harness agent (services/evaluation/harbor_agent.py) that name the harness's fault."""
PLATFORM_MARKERS = (
    "refused to create a sandbox", "could not prepare the sandbox", "could not make the sandbox's directories",
    "no sandbox credentials are bound", "has no model door", "Sandbox not found", "Harbor refuses its task.toml",
    "does not know its own address",
)
"""Messages of the gym's environment (services/evaluation/harbor/environment.py) and trials."""
SERVER_ERROR = re.compile(r"\b(?:HTTP |status(?: code)? )5\d\d\b", re.IGNORECASE)
NO_REWARD = "the verifier produced no reward"


def classify_failure(exception_type: str, message: str = "", phase: Phase = "prepare") -> FailureKind:
    """The kind of a trial's failure from its exception's type name, message and phase.

    Named types and messages decide first, in any phase: a connection error while the harness
    runs is still the platform's (the harness cannot reach the gateway, only its door), a
    verifier timeout is the verifier's. Otherwise the phase leans: an unknown exception while
    verifying is the verifier's; one while the harness was set up or ran is the agent's (the
    harness's own code ran in that sandbox and may have broken it, and the gym's own failures
    there have the named types above); one anywhere else — before the harness ran, in the gym's
    configuration of the trial, in the worker — is the platform's, never the agent's: nothing
    the system under test did can have caused it.
    """
    if exception_type in AGENT_TYPES or any(m in message for m in AGENT_MARKERS):
        return "agent"
    if exception_type in VERIFIER_TYPES or message == NO_REWARD:
        return "verifier"
    if exception_type in PLATFORM_TYPES or any(m in message for m in PLATFORM_MARKERS) or SERVER_ERROR.search(message):
        return "platform"
    return {"verify": "verifier", "agent": "agent"}.get(phase, "platform")  # type: ignore[return-value]


def classify_error(error: str, phase: Phase = "prepare") -> FailureKind:
    """:func:`classify_failure` of a recorded error, ``"<type name>: <message>"`` as trials write it
    (a bare message is taken whole)."""
    name, sep, message = error.partition(": ")
    if not sep or not name.isidentifier():
        return classify_failure("", error, phase)
    return classify_failure(name, message, phase)


def failure_kind(reward: float | None, error: str | None, kind: str | None) -> FailureKind | None:
    """The kind a recorded trial counts as: the one stored with it, else (a row recorded before
    kinds were, or by a runner that names none) its error's; None for a trial that did not fail.
    A trial with a reward and an error (a harness that timed out, then was verified) failed too."""
    if kind in ("platform", "verifier", "agent"):
        return kind  # type: ignore[return-value]
    if error:
        return classify_error(error)
    return None if reward is not None else "verifier"
