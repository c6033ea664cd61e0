"""The trial environment recognises some of Harbor's commands by their text and stands in for some
of Harbor's own (services/evaluation/harbor/known_commands.py). That knowledge was read from one
Harbor release; these tests fail when the installed Harbor no longer builds those commands as it
did, so an upgrade cannot quietly turn a skipped command into a wrong answer."""

from __future__ import annotations

import importlib.util
import warnings
from functools import cache
from importlib.metadata import version
from pathlib import Path

import pytest
from harbor.utils.scripts import quote_shell_arg

from services.evaluation.harbor.known_commands import (
    CHMOD_X,
    HARBOR_SOURCES,
    HARBOR_VERSION,
    HarborSource,
    chmod_x_path,
    rm_f_paths,
)

RECHECK = ("services/evaluation/harbor/known_commands.py: re-check what the environment does in this "
           "command's place against the installed Harbor, then record its lines and version there.")


@cache
def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"Harbor {version('harbor')} has no module {module}. {RECHECK}"
    return Path(spec.origin).read_text(encoding="utf-8")


def _missing() -> list[HarborSource]:
    return [s for s in HARBOR_SOURCES if s.text not in _source(s.module)]


@pytest.mark.parametrize("source", HARBOR_SOURCES, ids=lambda s: f"{s.module}:{s.text[:40]}")
def test_harbor_still_builds_each_command_the_environment_knows(source: HarborSource) -> None:
    assert source.text in _source(source.module), (
        f"Harbor {version('harbor')} (the knowledge is from {HARBOR_VERSION}) no longer has, in "
        f"{source.module}:\n    {source.text}\nrelied on by {source.relied_on_by}.\n{RECHECK}")


def test_harbor_is_the_pinned_release_or_its_commands_are_unchanged() -> None:
    installed = version("harbor")
    if installed == HARBOR_VERSION:
        return
    missing = _missing()
    assert not missing, (
        f"Harbor {installed} is installed; the environment's knowledge of its commands is from "
        f"{HARBOR_VERSION}, and these lines changed:\n"
        + "\n".join(f"  {s.module}: {s.text}  ({s.relied_on_by})" for s in missing) + f"\n{RECHECK}")
    warnings.warn(f"Harbor {installed} builds the commands as {HARBOR_VERSION} did: record {installed} as "
                  "HARBOR_VERSION in services/evaluation/harbor/known_commands.py", stacklevel=1)


def test_the_commands_as_harbor_quotes_them_are_recognised() -> None:
    """Built as the pinned lines build them: ``chmod +x`` of one quoted path, ``rm -f --`` of the
    reward files (a path with a space included, to exercise the quoting)."""
    script = "/tests/my test.sh"
    assert chmod_x_path(f"{CHMOD_X}{quote_shell_arg(script, None)}") == script
    rewards = ["/logs/verifier/reward.txt", "/logs/verifier/reward.json"]
    assert rm_f_paths("rm -f -- " + " ".join(quote_shell_arg(p, None) for p in rewards)) == rewards
    assert chmod_x_path("chmod +x relative.sh") is None and chmod_x_path("chmod +x /a /b") is None
    assert rm_f_paths("rm -rf /app") is None
