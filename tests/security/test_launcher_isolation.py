"""The launched research agent is contained at least as well as a sandbox: ``rsigym run start``
(the documented way to run an agent, as root, as CI runs it) starts a hostile agent
(tests/fakes/launched_attacker.py) that tries to become its host's root, to read the host's
secrets and to change what other processes run; the tests assert what it got: nothing."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.config import SandboxConfig
from kit.host_uids import POOL_SIZE
from ops import launcher
from tests.conftest import ADMIN_TOKEN, IN_CI
from tests.e2e.test_launcher import live, report, rsigym, wait_for_exit  # noqa: F401 - the live-gym fixture

ATTACKER = Path(__file__).resolve().parents[1] / "fakes" / "launched_attacker.py"
UID_BASE = SandboxConfig.model_fields["uid_base"].default


def require_root() -> None:
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("the launcher's isolation is tested as root (CI runs as root)")
        pytest.skip("the launcher's privileged path needs root")


def _digest(paths: list[Path]) -> dict[str, str]:
    out = {}
    for root in paths:
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _cmdlines() -> dict[int, bytes]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
    return out


@pytest.fixture
def operator_cli(tmp_path: Path) -> Iterator[Path]:
    """An operator-installed CLI (a directory bound read-only, as ``binds`` in agents.toml)."""
    cli = tmp_path / "opt-cli"
    cli.mkdir()
    tool = cli / "tool"
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    yield cli


def _agents_file(tmp_path: Path, cli: Path, sleep: float) -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(
        "[agents.attacker]\n"
        f"command = {json.dumps(['/usr/bin/python3', '-I', str(ATTACKER), '--target', str(cli / 'tool'), '--sleep', str(sleep)])}\n"
        f"binds = {json.dumps([str(ATTACKER), str(cli)])}\n")
    return path


def _wait_for(run: str, marker: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    log = ""
    while time.monotonic() < deadline:
        log = rsigym("run", "logs", run)
        if marker in log or rsigym("run", "show", run, "--json")["status"] != "running":
            return log
        time.sleep(0.2)
    return log


def test_the_launched_agent_gets_nothing_of_its_host(live: tuple[str, Path], operator_cli: Path,  # noqa: F811
                                                     tmp_path: Path) -> None:
    require_root()
    _, data_dir = live
    watched = [launcher.RELAY, launcher.AGENT_FILES, launcher.HARNESS_FILES, operator_cli, Path("/etc/passwd"),
               Path("/etc/group")]
    before = _digest(watched)
    agents = _agents_file(tmp_path, operator_cli, sleep=60)
    run = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "attacker", "--agents", str(agents),
                 "--json")["run"]
    try:
        log = _wait_for(run, "done: true", 60)
        assert "done: true" in log, log
        # From the host: the agent's processes run as an unprivileged uid of the host's pool.
        key = json.loads((data_dir / "runs" / run / "supervise.json").read_text())["key"]
        procs = {pid: cmd for pid, cmd in _cmdlines().items()  # the relay and the agent (not bubblewrap)
                 if str(ATTACKER).encode() in cmd and cmd.startswith(b"/usr/bin/python3\0")}
        assert len(procs) == 2, procs
        uids = {os.stat(f"/proc/{pid}").st_uid for pid in procs}
        assert all(UID_BASE <= uid < UID_BASE + POOL_SIZE for uid in uids), uids
        # No secret on any command line of the host (world-readable /proc/*/cmdline).
        for secret in (key, ADMIN_TOKEN):
            assert not [pid for pid, cmd in _cmdlines().items() if secret.encode() in cmd]
    finally:
        rsigym("run", "stop", run)
    assert not [cmd for cmd in _cmdlines().values() if str(ATTACKER).encode() in cmd]  # stop left nothing running
    home = data_dir / "runs" / run / "home"
    assert (home / "notes.txt").is_file() and home.stat().st_uid == (home / "notes.txt").stat().st_uid == 0
    seen = report(log)
    me = seen["identity"]
    assert me["uid"] != 0 and me["euid"] != 0 and me["gid"] != 0 and me["uid"] in uids, me
    assert me["CapEff"] == me["CapPrm"] == me["CapBnd"] == me["CapInh"] == me["CapAmb"] == "0000000000000000", me
    assert me["NoNewPrivs"] == "1" and me["Seccomp"] == "2", me
    assert seen["passwd"] == {"name": "agent", "home": launcher.HOME_INSIDE}  # real CLIs look themselves up
    assert "shadow" not in seen["etc"] and seen["shadow"] == "ENOENT"
    assert {"passwd", "group", "hosts", "ssl"} <= set(seen["etc"]), seen["etc"]
    assert not {"rsigym", "gshadow", "sudoers", "environment", "profile.d", "pip.conf"} & set(seen["etc"])
    assert seen["home_writable"] == "written"
    assert all(v != "written" for v in seen["writes"].values()), seen["writes"]
    assert all(v != "written" for v in seen["new_file"].values()), seen["new_file"]
    assert all(v == "EPERM" for v in seen["remount"].values()), seen["remount"]
    assert all(v != "written" for v in seen["after_remount"].values()), seen["after_remount"]
    assert seen["unshare_user"] == "EPERM" and seen["unshare_mount"] == "EPERM"
    assert seen["setuid0"] == "EPERM" and seen["ptrace_parent"] == "EPERM"
    assert _digest(watched) == before  # nothing another process runs was changed
    assert rsigym("run", "show", run, "--json")["status"] == "stopped"


def test_an_agent_that_stops_its_relay_is_still_killed_at_the_wall_clock(live: tuple[str, Path],  # noqa: F811
                                                                         tmp_path: Path) -> None:
    """The supervisor outside the sandbox owns the run's clock (ops/run_watch.py): an agent that
    freezes its relay (SIGSTOP, same uid) is still killed at the wall clock, with everything it
    started."""
    from tests.e2e.test_launcher import _quick_task

    require_root()
    marker = f"frozen-relay-{os.urandom(4).hex()}"
    script = ("import os, signal, subprocess, sys, time\n"
              "os.kill(os.getppid(), signal.SIGSTOP)\n"
              f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'],"
              " start_new_session=True)\n"
              "print('relay: frozen', flush=True)\ntime.sleep(600)\n")
    agents = tmp_path / "agents.toml"
    agents.write_text(f"[agents.freezer]\ncommand = {json.dumps(['/usr/bin/python3', '-c', script, marker])}\n")
    tasks = _quick_task(tmp_path / "tasks", "joint-frozen", "3s", [])
    started = time.monotonic()
    run = rsigym("run", "start", "--task", "joint-frozen", "--tasks-dir", str(tasks), "--agent", "freezer",
                 "--agents", str(agents), "--json")["run"]
    shown = wait_for_exit(run, tries=600)
    took = time.monotonic() - started
    log = rsigym("run", "logs", run)
    assert "relay: frozen" in log, log
    assert shown["status"] == "exited" and shown["exit_code"] == 124, log
    assert "the run's wall clock has passed; the agent is stopped" in log
    assert took < 3 + 10, took
    assert not [cmd for cmd in _cmdlines().values() if marker.encode() in cmd]  # nothing of the agent lives on
