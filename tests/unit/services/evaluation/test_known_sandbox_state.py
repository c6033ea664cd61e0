"""What the trial environment skips because it already knows the answer
(services/evaluation/harbor/environment.py): Harbor's resets of directories that are absent or empty, a
``chmod +x`` of a file it has just written, an ``rm -f`` of files in a directory it has just found
empty in a sandbox where nothing has ever run, the second listing of a directory that
``is_dir`` has just listed, and the second read of a file — or the write of the bytes just read
back. Each is played against a stand-in sandbox (an in-memory file tree that
records every call; no Harbor trial, no gateway) — and so is each case where the answer is *not*
known and the real command must run: something to remove, a link in the way, a process that ran
(and may have left something running), a file written since."""

from __future__ import annotations

import asyncio
import contextvars
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from e2b import FileType
from e2b.exceptions import FileNotFoundException, InvalidArgumentException, SandboxException
from harbor.environments.base import BaseEnvironment
from harbor.models.task.config import EnvironmentConfig

from services.evaluation.harbor.environment import GymSandboxEnvironment
from services.evaluation.harbor.image_plan import ImagePlan


@dataclass
class Info:
    type: FileType
    symlink_target: str | None = None
    path: str = ""
    size: int = 0


class Files:
    """An in-memory tree: path -> "dir" | "file" | ("link", target). Calls are logged."""

    def __init__(self, tree: dict[str, Any], log: list[tuple[str, str]]):
        self.tree, self.log = tree, log
        self.data: dict[str, bytes] = {}
        """Files' bytes (a file with none here holds b"x")."""

    def _kind(self, path: str) -> Any:
        return self.tree.get(str(PurePosixPath(path)))

    async def get_info(self, path: str) -> Info:
        self.log.append(("stat", path))
        kind = self._kind(path)
        if kind == "unreadable":
            raise SandboxException(f"permission denied: {path}")
        if kind is None:
            raise FileNotFoundException(path)
        if isinstance(kind, tuple):
            return Info(FileType.DIR, kind[1], path)
        return Info(FileType.DIR if kind == "dir" else FileType.FILE, None, path)

    async def list(self, path: str, depth: int = 1) -> list[Info]:
        self.log.append(("list", path))
        kind = self._kind(path)
        if kind is None:
            raise FileNotFoundException(path)
        if kind != "dir":
            raise InvalidArgumentException(f"path is not a directory: {path}")
        prefix = path.rstrip("/") + "/"
        return [Info(FileType.DIR if k == "dir" else FileType.FILE, None, p, len(self.data.get(p, b"x")))
                for p, k in sorted(self.tree.items()) if p.startswith(prefix)]

    async def write_files(self, batch: list[dict[str, Any]]) -> None:
        for entry in batch:
            self.log.append(("write", entry["path"]))
            self._put(entry["path"], entry["data"])

    async def write(self, path: str, data: bytes) -> None:
        self.log.append(("write", path))
        self._put(path, data)

    def _put(self, path: str, data: bytes) -> None:
        """As the daemon writes: the file's missing parents are made."""
        for parent in PurePosixPath(path).parents:
            self.tree.setdefault(str(parent), "dir")
        self.tree[path] = "file"
        self.data[path] = bytes(data)

    async def make_dir(self, path: str) -> bool:
        self.log.append(("make_dir", path))
        self.tree[path] = "dir"
        return True

    async def read(self, path: str, format: str = "bytes") -> bytearray:
        self.log.append(("read", path))
        if self._kind(path) is None:
            raise FileNotFoundException(path)
        return bytearray(self.data.get(path, b"x"))


class Handle:
    async def wait(self) -> Any:
        return type("Done", (), {"stdout": "", "stderr": "", "exit_code": 0})()


class Commands:
    def __init__(self, log: list[tuple[str, str]]):
        self.log = log

    async def run(self, command: str, **_: Any) -> Handle:
        self.log.append(("process", command))
        return Handle()


class Sandbox:
    def __init__(self, tree: dict[str, Any], log: list[tuple[str, str]]):
        self.files, self.commands = Files(tree, log), Commands(log)


def _env(tree: dict[str, Any] | None = None) -> tuple[GymSandboxEnvironment, list[tuple[str, str]]]:
    env = GymSandboxEnvironment.__new__(GymSandboxEnvironment)  # no Harbor trial: what exec and the files need
    log: list[tuple[str, str]] = []
    env._start_knowing_nothing()
    env._sandbox = Sandbox(dict(tree or {}), log)  # type: ignore[assignment]
    env._plan = ImagePlan()
    env._persistent_env = {}
    env.task_env_config = EnvironmentConfig()
    env._output_callbacks = contextvars.ContextVar("output_callbacks", default=())
    env._exec_env_overlays = contextvars.ContextVar("exec_env_overlays", default=())
    return env, log


def _processes(log: list[tuple[str, str]]) -> list[str]:
    return [what for kind, what in log if kind == "process"]


def _upload(env: GymSandboxEnvironment, tmp: Path, target: str, files: dict[str, int]) -> None:
    source = tmp / target.strip("/").replace("/", "_")
    source.mkdir(parents=True, exist_ok=True)
    for name, mode in files.items():
        (source / name).write_text("x")
        (source / name).chmod(mode)
    asyncio.run(env.upload_dir(source, target))


def _rm_rewards() -> str:  # as Harbor's Verifier._remove_reward_files builds it
    return "rm -f -- " + " ".join(shlex.quote(p) for p in ("/logs/verifier/reward.txt", "/logs/verifier/reward.json"))


def _harbor_verifier(env: GymSandboxEnvironment, tmp_path: Path) -> None:
    """Harbor's separate verifier, in its order: three resets, the artifacts, the removal of stale
    rewards, the tests, ``chmod +x`` of test.sh, test.sh."""
    asyncio.run(env.empty_dirs([PurePosixPath("/logs/verifier")], chmod=True))
    asyncio.run(env.empty_dirs(["/logs/artifacts"], chmod=True))
    _upload(env, tmp_path, "/logs/artifacts", {})
    asyncio.run(env.empty_dirs(["/app"], chmod=True))
    _upload(env, tmp_path, "/app", {"answer.txt": 0o644})
    assert asyncio.run(env.exec(_rm_rewards(), user="root")).return_code == 0
    _upload(env, tmp_path, "/tests", {"test.sh": 0o755})
    assert asyncio.run(env.exec("chmod +x /tests/test.sh", user="root")).return_code == 0
    asyncio.run(env.exec("/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"))


def test_a_fresh_verifier_sandbox_is_reset_filled_and_verified_in_one_process_start(tmp_path: Path) -> None:
    """Harbor's separate verifier, in its order: three resets, the artifacts, the removal of stale
    rewards, the tests, ``chmod +x`` of test.sh, test.sh. Nothing to remove anywhere: one listing
    of "/" (neither ``/logs`` nor ``/app`` is there, so none of the three is) and one process
    start, which makes the directories and sets their modes before the test runs."""
    env, log = _env({"/": "dir"})
    _harbor_verifier(env, tmp_path)

    assert [(kind, path) for kind, path in log if kind in ("stat", "list")] == [("list", "/")]
    (script,) = _processes(log)
    head, command = script.split("\n", 1)
    assert "mkdir -p -- /logs/verifier /logs/artifacts /app" in head
    assert "chmod 777 -- /logs/verifier /logs/artifacts /app" in head
    assert "chmod 755 -- /tests/test.sh" in head and "+x" not in head
    assert command.endswith("/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1")


@pytest.mark.parametrize("tree", [
    {"/app": "dir", "/app/stale.txt": "file"},  # something to remove: the image's (or an agent's) file
    {"/app": ("link", "/etc")},  # a link in the way
    {"/app": "file"},  # a file in the way
    {"/app": "unreadable"},  # no answer to the look: not known either
])
def test_a_directory_that_is_not_absent_or_empty_is_reset_by_harbors_own_command(tree: dict[str, Any]) -> None:
    env, log = _env(tree)
    asyncio.run(env.empty_dirs(["/app"], chmod=True))
    (script,) = _processes(log)
    assert BaseEnvironment._empty_dirs_command(env, ["/app"], chmod=True) in script


def test_a_pending_step_inside_the_directory_sends_it_to_harbors_command() -> None:
    env, log = _env()
    env._mkdirs(["/app/build"])  # an upload's empty directory, not made yet
    asyncio.run(env.empty_dirs(["/app"], chmod=True))
    (script,) = _processes(log)
    assert "find /app -mindepth 1" in script and "mkdir -p -- /app/build" in script


def test_stale_rewards_are_removed_for_real_once_any_process_has_run() -> None:
    """A process that ran may have left something running that writes a reward after the reset:
    from then on ``rm -f`` always runs."""
    env, log = _env()
    asyncio.run(env.exec("true"))
    asyncio.run(env.empty_dirs(["/logs/verifier"], chmod=True))
    asyncio.run(env.exec(_rm_rewards(), user="root"))
    assert len(_processes(log)) == 2 and _rm_rewards() in _processes(log)[-1]


@pytest.mark.parametrize("command", [
    _rm_rewards(),  # a reward file was uploaded into the directory after its reset
    "rm -f -- /logs/verifier/../reward.txt",  # climbs out of the directory found empty
    "rm -f -- /logs/reward.txt",  # not inside it
    "rm -rf -- /logs/verifier/reward.txt",  # another command
])
def test_rm_f_runs_unless_every_file_is_known_absent(command: str, tmp_path: Path) -> None:
    env, log = _env()
    asyncio.run(env.empty_dirs(["/logs/verifier"], chmod=True))
    if command == _rm_rewards():
        asyncio.run(env.upload_file(_file(tmp_path, 0o644), "/logs/verifier/reward.txt"))
    asyncio.run(env.exec(command, user="root"))
    assert _processes(log) and command in _processes(log)[-1]


def _file(tmp: Path, mode: int) -> Path:
    path = tmp / f"f{mode:o}"
    path.write_text("x")
    path.chmod(mode)
    return path


def test_chmod_x_of_a_file_just_written_is_set_up_and_of_anything_else_a_command(tmp_path: Path) -> None:
    env, log = _env()
    asyncio.run(env.upload_file(_file(tmp_path, 0o755), "/solution/solve.sh"))
    asyncio.run(env.upload_file(_file(tmp_path, 0o644), "/solution/data.sh"))
    asyncio.run(env.exec("chmod +x /solution/solve.sh", user="root"))  # already executable: nothing
    asyncio.run(env.exec("chmod +x /solution/data.sh", user="root"))  # deferred
    asyncio.run(env.exec("chmod +x /etc/other.sh", user="root"))  # not ours: runs, with the set-up
    (script,) = _processes(log)
    assert "chmod 755 -- /solution/solve.sh" in script and "chmod +x -- /solution/data.sh" in script
    assert script.endswith("chmod +x /etc/other.sh")
    asyncio.run(env.exec("chmod +x /solution/data.sh", user="root"))  # after a process start: runs
    assert _processes(log)[-1] == "chmod +x /solution/data.sh"


def test_is_dir_lists_once_for_the_download_that_follows_and_again_after_a_change(tmp_path: Path) -> None:
    env, log = _env({"/app": "dir", "/app/answer.txt": "file", "/logs/x": "file"})
    assert asyncio.run(env.is_dir("/app")) is True
    asyncio.run(env.download_dir("/app", tmp_path / "one"))
    assert [k for k, _ in log].count("list") == 1 and (tmp_path / "one" / "answer.txt").exists()

    assert asyncio.run(env.is_dir("/app")) is True
    asyncio.run(env.upload_file(_file(tmp_path, 0o644), "/app/late.txt"))  # the tree changed since
    asyncio.run(env.download_dir("/app", tmp_path / "two"))
    assert [k for k, _ in log].count("list") == 3 and (tmp_path / "two" / "late.txt").exists()

    assert asyncio.run(env.is_dir("/logs/x")) is False  # a file: refused listing, then the plain answer
    assert asyncio.run(env.is_dir("/nowhere")) is False
    assert ("stat", "/logs/x") in log and ("stat", "/nowhere") not in log


def _logged(log: list[tuple[str, str]], kind: str, path: str) -> int:
    return log.count((kind, path))


def test_a_file_just_read_is_not_read_again_nor_written_back_unchanged(tmp_path: Path) -> None:
    """Harbor's agent-log round trip for the oracle: the log read (download_file), its directory
    downloaded, then the log uploaded back — one read and no write where there were two and one."""
    env, log = _env({"/logs/agent": "dir", "/logs/agent/oracle.txt": "file"})
    env._sandbox.files.data["/logs/agent/oracle.txt"] = b"solved\n"  # type: ignore[union-attr]
    asyncio.run(env.download_file("/logs/agent/oracle.txt", tmp_path / "host" / "oracle.txt"))
    asyncio.run(env.download_dir("/logs/agent", tmp_path / "host"))
    assert (tmp_path / "host" / "oracle.txt").read_bytes() == b"solved\n"
    asyncio.run(env.upload_dir(tmp_path / "host", "/logs/agent"))
    assert _logged(log, "read", "/logs/agent/oracle.txt") == 1 and _logged(log, "write", "/logs/agent/oracle.txt") == 0
    asyncio.run(env.exec("chmod +x /logs/agent/oracle.txt"))  # "written": known to exist, so set-up
    assert _processes(log) == []

    (tmp_path / "host" / "oracle.txt").write_bytes(b"edited\n")  # other bytes: written
    asyncio.run(env.upload_dir(tmp_path / "host", "/logs/agent"))
    assert _logged(log, "write", "/logs/agent/oracle.txt") == 1

    asyncio.run(env.download_file("/logs/agent/oracle.txt", tmp_path / "again.txt"))
    asyncio.run(env.exec("true"))  # a process ran since the read: the same bytes are written for real
    asyncio.run(env.upload_dir(tmp_path / "host", "/logs/agent"))
    assert _logged(log, "write", "/logs/agent/oracle.txt") == 2


def test_reads_are_fresh_after_a_command_a_write_or_a_size_that_differs(tmp_path: Path) -> None:
    env, log = _env({"/logs": "dir", "/logs/reward.txt": "file", "/logs/other.txt": "file"})
    files = env._sandbox.files  # type: ignore[union-attr]
    files.data["/logs/reward.txt"] = b"0"
    asyncio.run(env.download_file("/logs/reward.txt", tmp_path / "a"))
    asyncio.run(env.exec("echo 1 > /logs/reward.txt"))  # a process ran: it may have changed anything
    files.data["/logs/reward.txt"] = b"1"
    asyncio.run(env.download_file("/logs/reward.txt", tmp_path / "b"))
    assert (tmp_path / "b").read_bytes() == b"1" and _logged(log, "read", "/logs/reward.txt") == 2

    asyncio.run(env.upload_file(_file(tmp_path, 0o644), "/logs/other.txt"))  # a write: everything read is stale
    asyncio.run(env.download_file("/logs/reward.txt", tmp_path / "c"))
    assert _logged(log, "read", "/logs/reward.txt") == 3

    files.data["/logs/reward.txt"] = b"1.0"  # changed behind the environment's back, and the listing says so
    asyncio.run(env.download_dir("/logs", tmp_path / "d"))
    assert (tmp_path / "d" / "reward.txt").read_bytes() == b"1.0" and _logged(log, "read", "/logs/reward.txt") == 4
    old = tmp_path / "old"
    old.write_bytes(b"1")  # the bytes read before: the file holds others now, so they are written
    asyncio.run(env.upload_file(old, "/logs/reward.txt"))
    assert _logged(log, "write", "/logs/reward.txt") == 1 and files.data["/logs/reward.txt"] == b"1"


def test_big_reads_are_not_kept(tmp_path: Path) -> None:
    from services.evaluation.harbor.environment import REMEMBERED_READ_BYTES

    env, log = _env({"/out": "dir", "/out/big.bin": "file"})
    env._sandbox.files.data["/out/big.bin"] = b"b" * (REMEMBERED_READ_BYTES + 1)  # type: ignore[union-attr]
    asyncio.run(env.download_file("/out/big.bin", tmp_path / "one"))
    asyncio.run(env.download_dir("/out", tmp_path / "two"))
    assert _logged(log, "read", "/out/big.bin") == 2


def test_one_listing_of_the_root_answers_until_the_sandbox_changes() -> None:
    env, log = _env({"/": "dir", "/etc": "dir", "/app": "dir", "/app/stale.txt": "file"})
    asyncio.run(env.empty_dirs(["/logs/verifier"], chmod=True))  # /logs absent: known from the listing
    asyncio.run(env.empty_dirs(["/app"], chmod=True))  # /app is there: looked at, not empty, Harbor's reset
    assert [(k, p) for k, p in log if k in ("stat", "list")] == [("list", "/"), ("stat", "/app"), ("list", "/app")]
    assert len(_processes(log)) == 1  # Harbor's own reset of /app, with the pending set-up at its head
    asyncio.run(env.empty_dirs(["/logs/artifacts"], chmod=True))  # a process ran since: the listing is taken again
    assert [(k, p) for k, p in log if k == "list"][-1] == ("list", "/")
    assert [k for k, _ in log].count("list") == 3


def test_a_root_that_cannot_be_listed_leaves_each_look_to_its_own_call() -> None:
    env, log = _env({"/app": "dir", "/app/x": "file"})  # the stand-in refuses to list "/" here
    asyncio.run(env.empty_dirs(["/logs/verifier"], chmod=True))
    assert ("stat", "/logs/verifier") in log and _processes(log) == []


@pytest.mark.parametrize("how", ["upload_file", "upload_dir"])
def test_a_write_makes_the_root_listing_stale(how: str, tmp_path: Path) -> None:
    """A write makes its parents: ``/data`` was missing from "/", and after a file lands in it,
    Harbor's reset of ``/data`` has that file to remove."""
    env, log = _env({"/": "dir", "/etc": "dir"})
    asyncio.run(env.empty_dirs(["/logs/verifier"], chmod=True))
    if how == "upload_file":
        asyncio.run(env.upload_file(_file(tmp_path, 0o644), "/data/f.txt"))
    else:
        _upload(env, tmp_path, "/data", {"f.txt": 0o644})
    asyncio.run(env.empty_dirs(["/data"], chmod=True))
    assert BaseEnvironment._empty_dirs_command(env, ["/data"], chmod=True) in _processes(log)[-1]


def _created(dirs: dict[str, int | None], tree: dict[str, Any]) -> tuple[GymSandboxEnvironment, list[tuple[str, str]]]:
    """An environment whose sandbox's create made ``dirs`` (the service's ``rsigymDirs``): the
    tree holds what the create made, and the environment learns what its answer said."""
    made = []
    for path in dirs:
        for parent in [*reversed(PurePosixPath(path).parents), PurePosixPath(path)]:
            if str(parent) not in tree:
                tree[str(parent)] = "dir"
                made.append(str(parent))
    env, log = _env(tree)
    env._learn_made(dirs, made)
    return env, log


def test_directories_made_at_the_create_need_no_look_and_no_program(tmp_path: Path) -> None:
    """Harbor's separate verifier on a sandbox whose create made ``/logs/verifier`` (777) and the
    working directory ``/app``: the reset of the first is nothing at all; ``/logs/artifacts`` is
    known absent (the create made ``/logs`` holding only ``verifier``) and ``/app`` known empty,
    so no listing or look is taken, and the one process start sets up only what the create did
    not: the artifacts directory, ``/app``'s mode 777 and test.sh's mode."""
    env, log = _created({"/logs/verifier": 0o777, "/app": None}, {"/": "dir"})
    _harbor_verifier(env, tmp_path)

    assert [(kind, path) for kind, path in log if kind in ("stat", "list")] == []
    (script,) = _processes(log)
    head = script.split("\n", 1)[0]
    assert "mkdir -p -- /logs/artifacts;" in head or "mkdir -p -- /logs/artifacts &&" in head
    assert "/logs/verifier" not in head
    assert "chmod 777 -- /logs/artifacts /app" in head and "chmod 755 -- /tests/test.sh" in head


def test_an_agent_sandbox_where_nothing_ran_is_collected_without_a_call(tmp_path: Path) -> None:
    """A nop agent: Harbor downloads the agent's logs and the artifacts, each after asking
    whether it is a directory; all were made empty at the create and nothing ran since."""
    env, log = _created({"/logs/agent": 0o777, "/logs/artifacts": 0o777, "/app": None}, {"/": "dir"})
    asyncio.run(env.download_dir("/logs/agent", tmp_path / "agent"))
    assert asyncio.run(env.is_dir("/logs/artifacts")) is True
    asyncio.run(env.download_dir("/logs/artifacts", tmp_path / "artifacts"))
    assert asyncio.run(env.is_dir("/app")) is True
    asyncio.run(env.download_dir("/app", tmp_path / "app"))
    assert log == [] and (tmp_path / "agent").is_dir() and not any((tmp_path / "app").iterdir())


@pytest.mark.parametrize("change", ["process", "write", "chmod", "existed"])
def test_what_the_create_made_is_not_trusted_after_anything_changed_it(change: str, tmp_path: Path) -> None:
    """After a process start, a file written inside, or a mode deferred on it, a made directory's
    emptiness and mode are no longer known; nor is a directory the create found already there."""
    tree: dict[str, Any] = {"/": "dir"}
    if change == "existed":
        tree.update({"/app": "dir", "/app/old.txt": "file"})
    env, log = _created({"/app": 0o777}, tree)
    if change == "process":
        asyncio.run(env.exec("true"))
    elif change == "write":
        asyncio.run(env.upload_file(_file(tmp_path, 0o644), "/app/new.txt"))
    elif change == "chmod":
        env._chmod({0o700: ["/app"]})
    asyncio.run(env.download_dir("/app", tmp_path / "got"))
    assert ("list", "/app") in log
    asyncio.run(env.ensure_dirs(["/app"], chmod=True))
    asyncio.run(env.exec("true"))
    if change in ("process", "chmod"):  # the 777 the create gave may be gone
        assert "chmod 777 -- /app" in _processes(log)[-1]
    else:
        assert "chmod 777" not in _processes(log)[-1]
