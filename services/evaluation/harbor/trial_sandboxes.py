"""A trial's credentials, shared HTTP client and account of its sandboxes.

Credentials never enter Harbor's config (it writes ``config.json`` / ``result.json`` /
``lock.json`` into the trial directory): the caller binds them for the duration of a trial
with :func:`trial_sandboxes`, a context variable the environment reads at start
(:func:`current_trial`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx

CREATE_TIMEOUT = httpx.Timeout(connect=10.0, read=120.0, write=60.0, pool=60.0)
_CLEANUP_TIMEOUT = httpx.Timeout(10.0, read=30.0)

log = logging.getLogger("rsigym.evaluation.harbor.trial_sandboxes")


@dataclass(frozen=True)
class SandboxCredentials:
    """What a trial's environment needs to open its sandbox; never serialized."""

    sandbox_key: str
    """The platform-minted key the sandbox is created (and metered) with: sandbox only, with a door."""
    door_key: str
    """The key the door puts on the sandbox's inference calls: one model, inference only."""
    judge: JudgeDoor | None = None
    """A judged benchmark's judge: the verifier's sandbox gets a door to it (never the agent's)."""

    def __repr__(self) -> str:  # keep keys out of logs and tracebacks
        return "SandboxCredentials(sandbox_key=***, door_key=***" + (", judge=***)" if self.judge else ")")


@dataclass(frozen=True)
class JudgeDoor:
    """What a judged task's verifier sandbox is created with: a door to ``/rollout/v1`` whose key
    (minted per job below the operator's key, rollout of one model only) never enters it."""

    key: str = field(repr=False)
    model: str
    max_tokens: int | None = None


class TrialSandboxes:
    """What one trial's environments share, and what they leave behind.

    One HTTP client for the trial's own calls to the sandbox API (creating an ``httpx`` client
    builds a TLS context: ~28 ms on this box, twice per trial), and the account of every
    sandbox the trial asked for: a create whose answer never came (cut short, timed out) may
    have left a sandbox nobody knows the id of; a sandbox whose kill did not go through is
    still running. :meth:`sweep` kills by id what is known and lists by the trial's metadata
    only when something is not.
    """

    def __init__(self, credentials: SandboxCredentials, gateway_url: str) -> None:
        self.credentials = credentials
        self.client = httpx.AsyncClient(timeout=CREATE_TIMEOUT, verify=_tls_context())
        self._base = gateway_url.rstrip("/") + "/sandbox"
        self.unanswered = 0
        """Creates sent whose outcome is unknown."""
        self.running: set[str] = set()
        """Sandboxes created and not (known to be) killed."""
        self.door_failures: dict[str, Any] | None = None
        """The calls the agent's model door could not carry because the platform failed
        (``rsigymDoorFailures``: count, last), read before its sandbox is killed."""
        self.judge_calls: dict[str, Any] | None = None
        """What the verifier's judge door was asked (``rsigymJudgeCalls``), read before its sandbox is killed."""

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.credentials.sandbox_key}

    async def sweep(self, metadata: dict[str, str]) -> None:
        """Kill what the trial may have left running (nothing to do after a clean trial)."""
        try:
            ids = set(self.running)
            if self.unanswered:
                listed = await self.client.get(f"{self._base}/v2/sandboxes", headers=self.headers,
                                               params={"metadata": urlencode(metadata)}, timeout=_CLEANUP_TIMEOUT)
                if listed.status_code == 200:
                    ids |= {s["sandboxID"] for s in listed.json() if isinstance(s, dict) and "sandboxID" in s}
            for sid in ids:
                response = await self.client.delete(f"{self._base}/sandboxes/{sid}", headers=self.headers,
                                                    timeout=_CLEANUP_TIMEOUT)
                if response.status_code in (204, 404):
                    self.running.discard(sid)
        except Exception as exc:  # noqa: BLE001 - best effort: the sandbox's own timeout still ends it
            log.warning("trial sandbox sweep failed (%s); left to the sandboxes' own timeout", exc)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verification context, built once (a gateway may be served over TLS)."""
    return httpx.create_ssl_context()


_TRIAL: contextvars.ContextVar[TrialSandboxes | None] = contextvars.ContextVar(
    "rsigym_trial_sandboxes", default=None)


@contextlib.asynccontextmanager
async def trial_sandboxes(credentials: SandboxCredentials, gateway_url: str) -> AsyncIterator[TrialSandboxes]:
    """Give environments started in this context (this asyncio task and the tasks it creates)
    these credentials, one client, and one account of their sandboxes."""
    trial = TrialSandboxes(credentials, gateway_url)
    token = _TRIAL.set(trial)
    try:
        yield trial
    finally:
        _TRIAL.reset(token)
        await trial.client.aclose()


def current_trial() -> TrialSandboxes | None:
    """What :func:`trial_sandboxes` bound for this context; ``None`` outside one."""
    return _TRIAL.get()
