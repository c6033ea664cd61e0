"""What a sandbox backend offers the service: lifecycle plus the agent protocol.

Requests and events are the small JSON vocabulary of the in-sandbox agent
(services/sandbox/backends/inbox_agent.py): ``start``/``connect`` stream
``{"start": {"pid"}}``, ``{"stdout"|"stderr": b64}``, ``{"end": {"exit_code", "status"}}``;
everything else answers one object, or ``{"error": {"code", "message"}}``. ``mkdirs``
(``{"dirs": [[path, mode | null], ...]}``) answers ``{"made": [path, ...]}``: every directory it
made, parents included and first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from kit.config import SandboxTemplate

STREAM_EVENTS = 64
"""Output events a process stream holds for its reader before the producer waits: a reader
that does not read stops the process's output (it blocks writing to its pipe, as under a
terminal), it never grows a buffer. Shared by the in-sandbox agent's copy of this number."""
STREAM_LINE_LIMIT = 1024 * 1024
"""The longest event line of a stream (an output chunk of 32 KiB is ~44 KiB of JSON), which is
also about what the service reads ahead of its reader."""


@dataclass
class SandboxSpec:
    sandbox_id: str
    template: SandboxTemplate
    owner: str = ""
    """The run that owns it (stamped on cloud sandboxes' metadata and checked on every use)."""
    envs: dict[str, str] = field(default_factory=dict)
    internet: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    timeout_s: int = 300
    door_port: int | None = None
    """Open one TCP port on the sandbox's loopback that leads to the host-side door socket
    (the only way out of a sandbox without network: an evaluation trial's model endpoint)."""


class SandboxBackend(Protocol):
    name: str

    def create(self, spec: SandboxSpec) -> str:
        """Start the sandbox; returns the backend's own reference. Raises GymError."""

    def make_dirs(self, sandbox_id: str, dirs: list[tuple[str, int | None]]) -> list[str]:
        """Make directories in a sandbox just created, before anything runs there (its create's
        ``rsigymDirs``): each with its parents, then its mode if one is named. Returns every
        directory it made (absent before), parents included and first; raises GymError (the first
        that could not be made) otherwise."""

    def kill(self, sandbox_id: str) -> None:
        """Stop every process of the sandbox and free what it held. Idempotent."""

    def alive(self, sandbox_id: str) -> bool: ...

    def door_path(self, sandbox_id: str) -> str | None:
        """Where the host must listen for the sandbox's door (None: no door support)."""

    async def call(self, sandbox_id: str, request: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, sandbox_id: str, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...

    def close(self) -> None:
        """Kill every sandbox (service shutdown)."""
