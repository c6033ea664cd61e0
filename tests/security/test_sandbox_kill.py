"""A sandbox's kill waits on its PID namespace's init (a pidfd), not on a sweep of /proc by uid:
code inside that keeps forking, daemonises and ignores signals is all gone when the kill returns,
with the sweep switched off; and the handle cannot be turned against another process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.config import SandboxTemplate
from kit.host_uids import pids_of_uid
from services.sandbox.backends import local as local_backend
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.local import INFO_FILE, LocalBackend
from services.sandbox.namespace_init import NamespaceInit
from tests.fakes.sandbox_commands import run_in_sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
MARKER = "rsigym-kill-race-3f9a"
SLOW_TO_DIE = ("import sys, time; b = bytearray(300 * 2**20); b[::4096] = bytes(len(b) // 4096); "
               "open(f'/tmp/touched-{sys.argv[1]}', 'w').close(); time.sleep(1000)")




def marked() -> list[int]:
    """Host pids whose command line carries the marker."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if MARKER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture
def backend() -> Iterator[LocalBackend]:
    b = LocalBackend(None, 233_000)
    yield b
    b.close()
    shutil.rmtree(b.root, ignore_errors=True)


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The uid sweep, recorded instead of run: whatever is gone after a kill went by the namespace."""
    swept: list[int] = []
    monkeypatch.setattr(local_backend, "kill_uid", lambda uid, **_: swept.append(uid))
    return swept


def test_forking_daemonised_signal_ignoring_code_is_gone_when_the_kill_returns(
        backend: LocalBackend, no_sweep: list[int]) -> None:
    backend.create(SandboxSpec("sbx_race", SandboxTemplate(name="base")))
    assert backend._sandboxes["sbx_race"].init is not None  # the handle on the namespace's init is held
    run_in_sandbox(backend, "sbx_race",
        # a spawner that forks for ever, a double-forked daemon in a session of its own, a process
        # that ignores every catchable signal: none of them is the agent's child any more
        f"(setsid bash -c 'while :; do (exec -a {MARKER} sleep 1000 &) ; sleep 0.002; done' "
        f"</dev/null >/dev/null 2>&1 &); "
        f"(setsid nohup bash -c 'trap \"\" TERM HUP INT; exec -a {MARKER} sleep 1000' >/dev/null 2>&1 &); "
        # and processes that take a while to die (their 300 MB are freed as they exit): a kill
        # that returned without waiting for the namespace to be empty would leave them listed
        f"for i in 1 2 3; do (setsid python3 -c '{SLOW_TO_DIE}' $i {MARKER} >/dev/null 2>&1 &); done; "
        f"while [ $(ls /tmp/touched-* 2>/dev/null | wc -l) -lt 3 ]; do sleep 0.01; done; true")
    deadline = time.monotonic() + 10
    while len(marked()) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(marked()) >= 20  # control: the spawner is spawning
    uid = backend._sandboxes["sbx_race"].uid
    backend.kill("sbx_race")
    assert marked() == []  # nothing left, at the moment the kill returned
    if uid is not None:  # not even a process in the middle of its exit (its command line is gone by then)
        assert pids_of_uid(uid) == []
    assert no_sweep == []  # and that was the namespace's doing, not the sweep's


def test_without_the_handle_the_kill_sweeps_by_uid(backend: LocalBackend, no_sweep: list[int]) -> None:
    backend.create(SandboxSpec("sbx_nohandle", SandboxTemplate(name="base")))
    local = backend._sandboxes["sbx_nohandle"]
    assert local.init is not None
    local.init.close()
    local.init = None  # as when bubblewrap named no init, or the pidfd could not be verified
    backend.kill("sbx_nohandle")
    assert no_sweep == ([local.uid] if local.uid is not None else [])


def test_a_named_pid_that_is_not_the_namespaces_init_is_never_held_nor_signalled(tmp_path: Path) -> None:
    """Whoever could write bubblewrap's info file (the gym's own, host-only dir: not the sandbox)
    would still not get another process killed: the pid must be the init of the named namespace."""
    victim = subprocess.Popen(["sleep", "1000"])
    try:
        namespace = os.stat(f"/proc/{victim.pid}/ns/pid").st_ino  # the host's namespace, not a sandbox's
        forged = [{"child-pid": victim.pid, "pid-namespace": namespace + 1},  # wrong namespace
                  {"child-pid": os.getpid(), "pid-namespace": 1},
                  {"child-pid": "1; rm -rf /", "pid-namespace": 2},
                  {"child-pid": 2 ** 40, "pid-namespace": namespace}]
        for info in forged:
            (tmp_path / INFO_FILE).write_text(json.dumps(info))
            assert NamespaceInit.from_info(tmp_path / INFO_FILE) is None, info
        (tmp_path / INFO_FILE).write_text("{not json")
        assert NamespaceInit.from_info(tmp_path / INFO_FILE) is None
        assert victim.poll() is None  # untouched
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


def test_a_sandboxes_init_is_held_only_while_it_runs(backend: LocalBackend) -> None:
    backend.create(SandboxSpec("sbx_held", SandboxTemplate(name="base")))
    local = backend._sandboxes["sbx_held"]
    assert local.init is not None
    info = json.loads((local.dir / INFO_FILE).read_text())
    assert local.init.pid == info["child-pid"]
    assert not local.init.wait_gone(0)  # running
    backend.kill("sbx_held")
    assert local.init is None  # released by the kill
    try:  # the init is dead: gone, or a zombie its new parent has not reaped yet
        stat = Path(f"/proc/{info['child-pid']}/stat").read_bytes()
        assert stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")
    except FileNotFoundError:
        pass
