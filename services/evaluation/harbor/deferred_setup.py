"""Set-up the environment defers: directories to make and modes to set, which nothing observes
until a command runs or a file is read, so they run at the head of the next command, in the same
process start, or alone just before a read (each start is ~15–25 ms of a trial)."""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass

ARGS_PER_COMMAND = 200
"""Paths per ``mkdir`` / ``chmod`` in the deferred set-up (a long list is split)."""
SETUP_FAILED = 97
"""Exit status of a command whose deferred setup (directories, modes) failed before it ran."""
SETUP_MARK = "rsigym-sandbox-setup-failed"
"""Written to stderr with :data:`SETUP_FAILED` and a nonce of the call, so neither a command's own
exit 97 nor its output (a verifier running an agent's program, say) can pass for a failed set-up."""

MKDIR = "command -p mkdir -p"


@dataclass(frozen=True)
class SetupStep:
    """One deferred set-up step (see ``GymSandboxEnvironment._defer``): ``command -- paths``."""

    command: str
    """``mkdir -p`` or a ``chmod`` with its mode."""
    paths: tuple[str, ...]

    @property
    def makes(self) -> tuple[str, ...] | None:
        """The directories it makes; ``None`` for a mode to set."""
        return self.paths if self.command == MKDIR else None

    @property
    def shell(self) -> str:
        return f"{self.command} -- " + " ".join(shlex.quote(p) for p in self.paths)


def setup_script(steps: list[SetupStep]) -> str:
    """The deferred steps as one shell line, in as few programs as it takes: every directory in
    one ``mkdir -p`` first, then one ``chmod`` per mode (in the steps' own order if a path has
    more than one mode coming). Making directories first changes nothing: the only modes a
    directory is given here are 777 (each program start in a sandbox is ~1 ms)."""
    made = list(dict.fromkeys(d for step in steps if step.makes for d in step.paths))
    modes: dict[str, list[str]] = {}
    for step in steps:
        if not step.makes:
            modes.setdefault(step.command, []).extend(step.paths)
    named = [p for paths in modes.values() for p in set(paths)]
    groups = list(modes.items()) if len(named) == len(set(named)) else [
        (step.command, list(step.paths)) for step in steps if not step.makes]
    lines = []
    for command, paths in ([(MKDIR, made)] if made else []) + groups:
        paths = list(dict.fromkeys(paths))
        for i in range(0, len(paths), ARGS_PER_COMMAND):
            lines.append(SetupStep(command, tuple(paths[i:i + ARGS_PER_COMMAND])).shell)
    return " && ".join(lines)


def guarded_head(steps: list[SetupStep]) -> tuple[str, str]:
    """The steps as the first line of a script, and the mark (:data:`SETUP_MARK` with a nonce of
    this call) that line writes to stderr, exiting :data:`SETUP_FAILED`, when a step fails — before
    the script's own lines run."""
    mark = f"{SETUP_MARK}-{secrets.token_hex(8)}"
    return "{ " + setup_script(steps) + f"; }} || {{ echo {mark} >&2; exit {SETUP_FAILED}; }}\n", mark
