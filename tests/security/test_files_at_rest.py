"""Files at rest belong to the gym (issue 50, item 6): the store and its -wal/-shm, datasets,
checkpoints, training logs, benchmarks, harness archives and trees, trial outputs and the data
dir itself are 0600 / 0700, and a sandbox's host-side files (its env file holds its environment)
are its own uid's: another local user reads and lists nothing of any run.

A real embedded gym does real work — a benchmark registered (its validation runs trials), a
harness uploaded, a dataset registered, a model trained two steps, a sandbox created with a
secret in its environment — then an unprivileged uid (``setpriv`` to nobody) tries to list every
directory and read every file under the data dir and the sandbox root. Twice: as the gym leaves
them, and with the data dir opened to traversal (0711), so the files' own modes are what stops it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kit.config import SandboxConfig
from tests.conftest import require_bwrap
from tests.fakes.live_gym import LiveGym, harness_archive, live_gym, mini_benchmark

NOBODY = 65534
SECRET = "rsigym-env-secret-3c9e71"
ROWS = "".join(f'{{"messages": [{{"role": "user", "content": "Repeat: owl {i}"}}, '
               f'{{"role": "assistant", "content": "owl {i}"}}]}}\n' for i in range(8)).encode()
PUBLIC = {"login-profile"}
"""The host's /etc/profile, rewritten (services/sandbox/login_profile.py): every sandbox uid binds it."""

PROBE = r"""
mode=files
for p in "$@"; do
  if [ "$p" = "--dirs" ]; then mode=dirs; continue; fi
  if [ "$mode" = files ]; then
    head -c 64 -- "$p" >/dev/null 2>&1 && echo "READ $p"
  else
    ls -a -- "$p" >/dev/null 2>&1 && echo "LISTED $p"
  fi
done
true
"""


@dataclass
class AtRest:
    data: Path
    sandbox_root: Path
    files: list[Path]
    dirs: list[Path]
    sb_files: list[Path]
    sb_dirs: list[Path]


@pytest.fixture(scope="module")
def at_rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AtRest]:
    """A gym after real work, its sandbox still running; the trees as they are then."""
    require_bwrap()
    # The data dir's parent is traversable (pytest's own temp root is not), so what stops the
    # attacker is the gym's modes, not where the test happened to put it.
    base = Path(tempfile.mkdtemp(prefix="rsigym-at-rest-"))
    base.chmod(0o711)
    try:
        # no warm pool: the test's sandbox starts cold, its environment written to its env file
        with live_gym(base / "data", trial_concurrency=2, sandbox=SandboxConfig(warm_pool=0)) as live:
            sbx = _do_work(live, tmp_path_factory.mktemp("bench"))
            try:
                data = Path(live.gym.gateway.context.settings.data_dir)
                sandbox_root = Path(live.gym.service_apps["sandbox"].state.sandbox.backend.root)
                yield AtRest(data, sandbox_root, *_walk(data), *_walk(sandbox_root))
            finally:
                sbx.kill()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _walk(root: Path) -> tuple[list[Path], list[Path]]:
    """(every non-directory, every directory) under ``root``, root included, links not followed."""
    files, dirs = [], [root]
    for parent, names, leaves in os.walk(root):
        dirs += [Path(parent) / n for n in names if not (Path(parent) / n).is_symlink()]
        files += [Path(parent) / n for n in leaves]
    return files, dirs


def _as_nobody(files: list[Path], dirs: list[Path], root: Path | None = None) -> list[str]:
    """What an unprivileged local user could read or list (and, below ``root``, find): one line per success."""
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
            "/bin/sh", "-c", PROBE, "probe", *map(str, files), "--dirs", *map(str, dirs)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    found = done.stdout.split("\n")
    if root is None:
        return [line for line in found if line]
    find = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                           "find", str(root)], capture_output=True, text=True, timeout=60)
    below = [line for line in find.stdout.splitlines() if line != str(root)]
    return [line for line in found if line] + [f"FOUND {line}" for line in below]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _do_work(live: LiveGym, tmp: Path) -> Any:
    from e2b import Sandbox

    row = live.register(mini_benchmark(tmp, name="rest", per_split=1))
    assert row["status"] == "ready", row  # its validation ran trials: their outputs are on disk
    key = live.key(budget=5.0)
    with live.agent(key) as agent:
        harness = agent.post("/evaluation/v1/harnesses", content=harness_archive("mine", "echo 0 > /app/answer.txt\n"))
        assert harness.status_code == 201, harness.text
        ds = agent.post("/training/v1/datasets", content=ROWS, params={"name": "owls"})
        assert ds.status_code == 201, ds.text
        job = agent.post("/training/v1/jobs", json={"datasets": [ds.json()["id"]], "base_model": "tiny", "steps": 2,
                                                    "batch_size": 4, "max_length": 64}).json()
        deadline = time.monotonic() + 300
        while (job := agent.get(f"/training/v1/jobs/{job['id']}").json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.3)
        assert job["status"] == "succeeded" and job["checkpoints"], job
    sbx = Sandbox.create(template="base", timeout=120, envs={"RUN_SECRET": SECRET}, api_key=key["key"],
                         api_url=f"{live.url}/sandbox", sandbox_url=f"{live.url}/sandbox/envd")
    # the sandbox reads its own env file: the one uid it was handed to
    assert sbx.commands.run("echo $RUN_SECRET").stdout.strip() == SECRET
    return sbx


def test_the_gyms_files_are_its_own(at_rest: AtRest) -> None:
    data, files, dirs = at_rest.data, at_rest.files, at_rest.dirs
    names = {p.relative_to(data).as_posix() for p in files}
    # control: the work left what it should, where it should
    for expected in ("gym.sqlite3", "gym.sqlite3-wal", "gym.sqlite3-shm", "internal-secret"):
        assert expected in names, sorted(names)
    for prefix in ("datasets/", "checkpoints/", "jobs/", "evaluation/benchmarks/", "evaluation/harnesses/",
                   "evaluation/trials/"):
        assert any(n.startswith(prefix) for n in names), (prefix, sorted(names))

    # the data dir's tree is the gym's alone
    assert _mode(data) == 0o700
    wrong = [f"{p} {oct(_mode(p))}" for p in dirs if _mode(p) != 0o700]
    wrong += [f"{p} {oct(_mode(p))}" for p in files if not p.is_symlink() and _mode(p) not in (0o600, 0o700)]
    assert not wrong, wrong
    for name in ("gym.sqlite3", "gym.sqlite3-wal", "gym.sqlite3-shm", "internal-secret"):
        assert _mode(data / name) == 0o600, name


def test_a_sandboxs_host_side_is_its_uids_alone(at_rest: AtRest) -> None:
    root, sb_files, sb_dirs = at_rest.sandbox_root, at_rest.sb_files, at_rest.sb_dirs
    envs = [p for p in sb_files if p.name == "env.json" and p.parent.parent == root]  # not ctl's mount point
    assert envs and any(SECRET in p.read_text() for p in envs)  # control: the secret is on disk
    for env in envs:  # the sandbox's uid's alone (the gym's, when it is not root), in a directory it cannot change
        assert _mode(env) == 0o400 and env.parent.stat().st_uid == os.geteuid(), env
        assert env.stat().st_uid != 0 or os.geteuid() != 0, env
    # traversable to their own uid, listable by nobody, no content for anyone else
    assert not [p for p in sb_dirs if _mode(p) & 0o066], [(p, oct(_mode(p))) for p in sb_dirs]
    readable = [p for p in sb_files if p.name not in PUBLIC and not stat.S_ISSOCK(p.lstat().st_mode)
                and _mode(p) & 0o044]
    assert not readable, [(p, oct(_mode(p))) for p in readable]


def test_another_local_user_reads_and_lists_nothing(at_rest: AtRest) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("the attacker is another local uid: needs root and setpriv")
    data, files, dirs = at_rest.data, at_rest.files, at_rest.dirs
    sb_files = [p for p in at_rest.sb_files if p.name not in PUBLIC]
    # as the gym leaves things …
    assert _as_nobody(files, dirs, data) == []
    assert _as_nobody(sb_files, at_rest.sb_dirs, at_rest.sandbox_root) == []
    # … and with the data dir opened to traversal: the files' and directories' own modes hold
    data.chmod(0o711)
    try:
        assert _as_nobody(files, dirs[1:], data) == []
    finally:
        data.chmod(0o700)
    # control: the probe does see what another user may see
    canary = data.parent / "canary"
    canary.write_text("public\n")
    canary.chmod(0o644)
    data.parent.chmod(0o755)
    assert sorted(_as_nobody([canary], [data.parent], data.parent)) == sorted(
        [f"READ {canary}", f"LISTED {data.parent}", f"FOUND {data}", f"FOUND {canary}"])
