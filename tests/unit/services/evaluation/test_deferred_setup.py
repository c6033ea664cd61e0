"""What the trial environment does with set-up it deferred when the sandbox's files are read before
any command runs (services/evaluation/harbor/environment.py, ``_run_setup``): one or two directories to
make go by the files API, anything more — or anything that is not a directory to make — in one
process start; a make that fails raises and leaves the set-up pending, and nothing is read before
the set-up has run. The sandbox here is a recording stand-in: no Harbor, no gateway."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.evaluation.harbor.environment import GymSandboxEnvironment


class Files:
    def __init__(self, log: list[tuple[str, str]], refuse: str | None = None):
        self.log, self.refuse = log, refuse

    async def make_dir(self, path: str) -> bool:
        if path == self.refuse:
            raise RuntimeError("a file is in the way")
        self.log.append(("make_dir", path))
        return True

    async def get_info(self, path: str) -> Any:
        self.log.append(("get_info", path))
        return type("Info", (), {"type": "dir"})()


class Sandbox:
    def __init__(self, log: list[tuple[str, str]], refuse: str | None = None):
        self.files = Files(log, refuse)


def _env(refuse: str | None = None) -> tuple[GymSandboxEnvironment, list[tuple[str, str]]]:
    env = GymSandboxEnvironment.__new__(GymSandboxEnvironment)  # no Harbor: only what _run_setup touches
    log: list[tuple[str, str]] = []
    env._start_knowing_nothing()
    env._sandbox = Sandbox(log, refuse)  # type: ignore[assignment]

    async def process_start(script: str, **_: Any) -> None:  # stands in for _with_setup: one process start
        log.append(("process", " && ".join(step.shell for step in env._setup)))
        env._setup = []

    env._with_setup = process_start  # type: ignore[assignment,method-assign]
    return env, log


def test_one_or_two_directories_go_by_the_files_api_before_a_read() -> None:
    env, log = _env()
    env._mkdirs(["/logs/artifacts"])
    env._mkdirs(["/app"])
    asyncio.run(env._path_type("/app"))
    assert log == [("make_dir", "/logs/artifacts"), ("make_dir", "/app"), ("get_info", "/app")]
    assert env._setup == []
    asyncio.run(env._path_type("/app"))  # nothing pending: nothing made again
    assert log[-1] == ("get_info", "/app") and len(log) == 4


@pytest.mark.parametrize("pending", [
    [(["/a", "/b", "/c"], None)],  # three directories: one process start is cheaper
    [(["/a"], None), (None, "command -p chmod 777")],  # a mode to set: only a command does that
])
def test_anything_more_runs_in_one_process_start_before_the_read(pending: list[tuple[Any, Any]]) -> None:
    env, log = _env()
    for dirs, step in pending:
        if dirs is not None:
            env._mkdirs(dirs)
        else:
            env._defer(step, ["/a"])
    asyncio.run(env._path_type("/a"))
    assert [kind for kind, _ in log] == ["process", "get_info"]
    assert env._setup == []


def test_a_failed_make_raises_and_keeps_the_set_up_pending() -> None:
    env, log = _env(refuse="/app")
    env._mkdirs(["/logs/artifacts", "/app"])
    with pytest.raises(RuntimeError, match="could not create /app"):
        asyncio.run(env._path_type("/app"))
    assert ("get_info", "/app") not in log  # nothing read past a set-up that did not run
    assert [step.makes for step in env._setup] == [("/logs/artifacts", "/app")]  # runs again with what comes next
