"""Which of Harbor's commands the environment skips or answers itself, and the Harbor they are
taken from.

The environment keeps what it knows of its sandbox's files and skips a call or a process start
whose outcome that already settles (see ``GymSandboxEnvironment``). Some of what it skips are
Harbor's shell commands, recognised by their text — the text Harbor builds — and some are
Harbor methods it answers itself (``empty_dirs``, ``ensure_dirs``), standing in for the command
Harbor would have run. That knowledge holds for the Harbor it was taken from,
:data:`HARBOR_VERSION`; :data:`HARBOR_SOURCES` names every line of Harbor's source it rests on,
and tests/unit/services/evaluation/test_harbor_pin.py fails when the installed Harbor no longer has one verbatim.

After a Harbor upgrade that fails that test: read each changed line in the new Harbor, re-check
what the environment does in its place (each :class:`HarborSource` says what), change the
matchers here or the environment to fit, then record the new lines and version here.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

HARBOR_VERSION = "0.26.0"
"""The Harbor release the commands below were read from and the environment was tested with."""

CHMOD_X = "chmod +x "
"""How Harbor's oracle and verifier make a task's ``solve.sh`` / ``test.sh`` executable."""
RM_F = "rm -f "
"""How Harbor's verifier removes stale reward files (``rm -f -- FILE...``)."""
AGENT_SESSION_SUFFIX = "__env"
"""The agent's environment is session ``<trial>__env``; a separate verifier's is
``<trial>__verifier__<key>``."""


@dataclass(frozen=True)
class HarborSource:
    """One line of Harbor's source the environment's knowledge rests on."""

    module: str
    text: str
    """Verbatim, without its indentation."""
    relied_on_by: str
    """What in the environment depends on it: what to re-check when it changes."""


HARBOR_SOURCES: tuple[HarborSource, ...] = (
    HarborSource("harbor.agents.oracle",
                 'command=f"chmod +x {quote_shell_arg(container_solve_path, task_os)}"',
                 "chmod_x_path: the oracle's chmod +x of solve.sh, set up rather than run for a file just written"),
    HarborSource("harbor.verifier.verifier",
                 'command=f"chmod +x {quote_shell_arg(test_script_path, self.environment.os)}"',
                 "chmod_x_path: the verifier's chmod +x of test.sh, set up rather than run for a file just written"),
    HarborSource("harbor.verifier.verifier",
                 'command = "rm -f -- " + " ".join(',
                 "rm_f_paths: the verifier's removal of stale rewards, skipped in a directory just found empty"),
    HarborSource("harbor.verifier.verifier",
                 "quote_shell_arg(path, self.environment.os) for path in reward_paths",
                 "rm_f_paths: the reward files, one quoted word each"),
    HarborSource("harbor.utils.scripts",
                 "return shlex.quote(str(value))",
                 "chmod_x_path, rm_f_paths: a POSIX task's paths are quoted as shlex.split reads them"),
    HarborSource("harbor.trial.trial",
                 'session_id=f"{self.config.trial_name}__env"',
                 "AGENT_SESSION_SUFFIX: only the agent's sandbox gets the model door"),
    HarborSource("harbor.trial.trial",
                 'raw = f"{self.config.trial_name}__verifier__{key}"',
                 "AGENT_SESSION_SUFFIX: a separate verifier's sandbox gets no model door"),
    HarborSource("harbor.environments.base",
                 'f"if [ -L {quoted} ] || {{ [ -e {quoted} ] && [ ! -d {quoted} ]; }}; then rm -rf {quoted}; fi",',
                 "empty_dirs: a link or a file in the way runs Harbor's own reset"),
    HarborSource("harbor.environments.base",
                 'f"mkdir -p {quoted}",',
                 "empty_dirs: a directory absent or empty is only made (deferred)"),
    HarborSource("harbor.environments.base",
                 'f"find {quoted} -mindepth 1 -maxdepth 1 -exec rm -rf -- {{}} +",',
                 "empty_dirs: nothing to remove in a directory absent or empty"),
    HarborSource("harbor.environments.base",
                 'commands.append(f"chmod 777 {quoted}")',
                 "empty_dirs: the mode 777 of the reset directory (deferred)"),
    HarborSource("harbor.environments.base",
                 'command = f"mkdir -p {create_args}"',
                 "ensure_dirs: the directories made (deferred)"),
    HarborSource("harbor.environments.base",
                 'command += f" && chmod 777 {create_args}"',
                 "ensure_dirs: their mode 777 (deferred)"),
)


def chmod_x_path(command: str) -> str | None:
    """The absolute path of a ``chmod +x PATH`` as Harbor builds it; ``None`` for any other command."""
    if not command.startswith(CHMOD_X):  # before any parsing: every command comes through here
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if len(words) != 3 or words[:2] != ["chmod", "+x"] or not words[2].startswith("/"):
        return None
    return words[2]


def rm_f_paths(command: str) -> list[str] | None:
    """The files of an ``rm -f [--] FILE...`` as Harbor builds it; ``None`` for any other command."""
    if not command.startswith(RM_F):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words[:2] != ["rm", "-f"]:
        return None
    return words[3:] if words[2:3] == ["--"] else words[2:]
