"""What a local sandbox may not reach: the host's loopback services (the gateway's port
included), any other network, the gym's environment and data dir, other sandboxes' files;
and what it may not do to the host: fork bombs and memory bombs stay inside, and nothing of
a sandbox outlives it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from e2b import Sandbox

from tests.conftest import create_key
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
HOST_SECRET = "rsigym-host-secret-5f1d0c"


@pytest.fixture
def env(gym: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("RSIGYM_TEST_HOST_SECRET", HOST_SECRET)  # in the gateway's own environment
    with serve_gym(gym) as url, httpx.Client(base_url=url) as client:
        key = create_key(client, budget_usd=1.0)["key"]
        opts = {"api_key": key, "api_url": f"{url}/sandbox", "sandbox_url": f"{url}/sandbox/envd"}
        backend = gym.service_apps["sandbox"].state.sandbox.backend
        yield {"url": url, "opts": opts, "gym": gym, "backend": backend, "client": client}


def sh(sbx: Sandbox, cmd: str, timeout: float = 60) -> Any:
    return sbx.commands.run(cmd, timeout=timeout, request_timeout=timeout + 10, on_stdout=None)


def test_no_route_to_host_loopback_or_any_network(env: dict[str, Any]) -> None:
    port = urlparse(env["url"]).port
    sbx = Sandbox.create(template="base", timeout=120, **env["opts"])
    try:
        # control: from the host, the gateway and PostgreSQL answer on 127.0.0.1
        assert httpx.get(f"{env['url']}/healthz").status_code == 200
        for target in (f"127.0.0.1/{port}", "127.0.0.1/5432", "127.0.0.1/6379", "1.1.1.1/53", "10.0.0.1/80"):
            r = sbx.commands.run(f"timeout 5 bash -c 'exec 3<>/dev/tcp/{target}' && echo OPEN || echo CLOSED",
                                 request_timeout=30)
            assert r.stdout.strip().endswith("CLOSED"), (target, r.stdout, r.stderr)
        interfaces = sbx.commands.run("cat /proc/net/dev").stdout
        assert [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]] == ["lo"]
        r = sbx.commands.run("getent hosts example.com || echo NO-DNS")
        assert "NO-DNS" in r.stdout
    finally:
        sbx.kill()


def test_host_secrets_are_unreadable(env: dict[str, Any]) -> None:
    gym = env["gym"]
    data_dir = Path(gym.gateway.context.settings.data_dir)
    assert (data_dir / "gym.db").exists() or any(data_dir.iterdir())  # control: the data dir is real
    sbx = Sandbox.create(template="base", timeout=120, **env["opts"])
    try:
        r = sbx.commands.run("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
        assert HOST_SECRET not in r.stdout and "RSIGYM" not in r.stdout.replace("E2B_SANDBOX", "")
        # the gym's data dir, the checkout, the admin token and /root simply are not there
        for path in (data_dir, data_dir / "admin-token", Path.cwd(), "/root", "/work"):
            r = sbx.commands.run(f"ls -la {path} 2>&1; cat {path}/admin-token 2>&1 || true")
            assert "No such file or directory" in r.stdout or "Permission denied" in r.stdout, (path, r.stdout)
        # (the read-only system dirs are the host's own /usr, /lib …; everything else is searched)
        excluded = " ".join(f"--exclude-dir={d}" for d in ("proc", "sys", "usr", "lib", "lib64", "bin", "sbin"))
        r = sbx.commands.run(f"grep -rs {HOST_SECRET} / {excluded} 2>/dev/null | head -1; true",
                             timeout=120, request_timeout=150)
        assert HOST_SECRET not in r.stdout
        # only the sandbox's own processes are visible
        r = sbx.commands.run("ls /proc | grep -c '^[0-9]'")
        assert int(r.stdout.strip()) < 10
    finally:
        sbx.kill()


def test_other_sandboxes_files_are_unreadable(env: dict[str, Any]) -> None:
    backend = env["backend"]
    a = Sandbox.create(template="base", timeout=120, **env["opts"])
    b = Sandbox.create(template="base", timeout=120, **env["opts"])
    try:
        a.files.write("/home/user/secret.txt", "sandbox-a-secret")
        assert a.commands.run("cat /home/user/secret.txt").stdout == "sandbox-a-secret"  # control
        host_dir = backend.root / a.sandbox_id
        assert host_dir.is_dir() and not list(host_dir.rglob("secret.txt"))  # only in a's own tmpfs
        r = b.commands.run(f"cat {host_dir}/fs/home/user/secret.txt /proc/*/root/home/user/secret.txt 2>&1; true")
        assert "No such file or directory" in r.stdout and "sandbox-a-secret" not in r.stdout
        r = b.commands.run("ls /home/user; find / -name secret.txt 2>/dev/null; true", timeout=120,
                           request_timeout=150)
        assert "secret.txt" not in r.stdout
        # and with the host path's parent: sandbox uids differ, the dirs are private
        uid_a = int(a.commands.run("id -u").stdout)
        uid_b = int(b.commands.run("id -u").stdout)
        assert uid_a != uid_b or os.geteuid() != 0
    finally:
        a.kill()
        b.kill()


def test_fork_bomb_is_contained(env: dict[str, Any]) -> None:
    backend = env["backend"]
    cap = env["gym"].gateway.config.sandbox.template("base").max_processes
    sbx = Sandbox.create(template="base", timeout=300, **env["opts"])
    try:
        sbx.commands.run("bash -c ':(){ :|:& };:' >/dev/null 2>&1", background=True)
        peak, healthy = 0, []
        for _ in range(20):  # while the bomb rages: count its processes, and use the host
            peak = max(peak, len(backend.processes_of(sbx.sandbox_id)))
            healthy.append(httpx.get(f"{env['url']}/healthz", timeout=10).status_code == 200)
            healthy.append(subprocess.run(["true"], timeout=10).returncode == 0)
            time.sleep(0.1)
        assert all(healthy)
        print(f"\nfork bomb: peak {peak} processes (cap {cap}); host answered {len(healthy)} probes meanwhile")
        if os.geteuid() == 0:  # per-sandbox uid: the bomb ran into the sandbox's process cap
            assert cap // 2 <= peak <= cap, peak
    finally:
        sbx.kill()
    assert backend.processes_of(sbx.sandbox_id) == []


def test_memory_bomb_is_contained(env: dict[str, Any]) -> None:
    sbx = Sandbox.create(template="base", timeout=300, **env["opts"])
    try:
        r = sbx.commands.run(
            "python3 -c \"a=[]\nwhile True: a.append(bytearray(50*2**20))\" 2>&1 | tail -1; echo rc=${PIPESTATUS[0]}",
            timeout=60, request_timeout=90)
        assert "MemoryError" in r.stdout and "rc=1" in r.stdout
        assert httpx.get(f"{env['url']}/healthz", timeout=10).status_code == 200
        assert sbx.commands.run("echo still-alive").stdout.strip() == "still-alive"
    finally:
        sbx.kill()


def test_no_process_survives_its_sandbox(env: dict[str, Any]) -> None:
    backend = env["backend"]
    marker = "rsigym-survivor-7c1e"
    sbx = Sandbox.create(template="base", timeout=120, **env["opts"])
    sbx.commands.run(f"setsid nohup bash -c 'exec -a {marker} sleep 1000' >/dev/null 2>&1 & "
                     f"(bash -c 'exec -a {marker} sleep 1000' >/dev/null 2>&1 &) ; sleep 0.2; true")
    sbx.commands.run(f"exec -a {marker} sleep 1000", background=True)

    def survivors() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(pid)
            except OSError:
                continue
        return found

    deadline = time.monotonic() + 10
    while len(survivors()) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(survivors()) >= 3  # control: they run
    sbx.kill()
    assert survivors() == []
    assert backend.processes_of(sbx.sandbox_id) == []
