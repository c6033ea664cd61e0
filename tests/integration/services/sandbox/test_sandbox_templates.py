"""Templates: a host profile shows only the listed host directories; a rootfs template shows
the image's own tree instead of the host's."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import pytest

from kit.config import SandboxTemplate
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.local import LocalBackend
from tests.fakes.sandbox_commands import run_in_sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")




@pytest.fixture
def backend():
    b = LocalBackend(None, 231_000)  # a fresh root under /tmp (pytest's tmp_path is 0700)
    yield b
    b.close()
    shutil.rmtree(b.root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are used only when the gym runs as root")
def test_a_root_the_sandbox_uids_cannot_reach_is_refused_at_start(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="not traversable"):
        LocalBackend(str(private / "sandboxes"), 231_000)


def test_rootfs_template_replaces_the_hosts_tree(tmp_path: Path, backend: LocalBackend) -> None:
    rootfs = backend.root.parent / f"{backend.root.name}-image"  # readable by the sandbox's uid
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "image-release").write_text("rsigym-test-image 1\n")
    for d in ("usr", "bin", "lib", "lib64"):  # the image borrows the host's binaries
        if os.path.exists(f"/{d}"):
            (rootfs / d).symlink_to(f"/{d}")
    template = SandboxTemplate(name="image", kind="rootfs", rootfs=str(rootfs))
    backend.create(SandboxSpec("sbx_rootfs", template))
    try:
        out = run_in_sandbox(backend, "sbx_rootfs", "cat /etc/image-release; ls /etc; test -e /etc/hostname || echo no-host-etc")
        assert "rsigym-test-image 1" in out and "no-host-etc" in out
    finally:
        backend.kill("sbx_rootfs")
        shutil.rmtree(rootfs, ignore_errors=True)


def test_host_profile_binds_only_the_listed_dirs(backend: LocalBackend) -> None:
    template = SandboxTemplate(name="slim", host_dirs=["/usr", "/bin", "/lib", "/lib64"])
    backend.create(SandboxSpec("sbx_slim", template))
    try:
        out = run_in_sandbox(backend, "sbx_slim", "ls /; test -e /etc/passwd && echo has-etc || echo no-etc")
        assert "no-etc" in out and "usr" in out.split()
    finally:
        backend.kill("sbx_slim")


def test_cpu_time_and_file_size_limits_hold(backend: LocalBackend) -> None:
    template = SandboxTemplate(name="tight", cpu_seconds=1, max_file_mb=1)
    backend.create(SandboxSpec("sbx_tight", template))
    try:
        out = run_in_sandbox(backend, "sbx_tight", "timeout 20 bash -c 'while :; do :; done'; echo cpu-exit=$?")
        assert "cpu-exit=137" in out or "cpu-exit=152" in out, out  # SIGKILL or SIGXCPU at 1 s of CPU
        out = run_in_sandbox(backend, "sbx_tight", "head -c 3000000 /dev/zero > big 2>/dev/null; echo fsize-exit=$?; "
                                        "stat -c %s big")
        assert "fsize-exit=153" in out or "fsize-exit=1" in out, out  # SIGXFSZ, or EFBIG
        assert out.strip().splitlines()[-1] == str(1024 * 1024)  # nothing beyond the 1 MiB limit was written
    finally:
        backend.kill("sbx_tight")


def test_a_login_shell_asks_no_id_process_and_gets_the_hosts_path(backend: LocalBackend) -> None:
    """E2B's SDK runs every command in a login shell; the sandbox's /etc/profile answers its
    ``id -u`` without a process, and the PATH it sets is the one the host's own file sets."""
    original = Path("/etc/profile").read_text() if Path("/etc/profile").exists() else ""
    if '"$(id -u)"' not in original:
        pytest.skip("this host's /etc/profile starts no id process: nothing to rewrite")
    backend.create(SandboxSpec("sbx_login", SandboxTemplate(name="base")))
    try:
        traced = run_in_sandbox(backend, "sbx_login", "bash -l -x -c true 2>&1")
        login_path = run_in_sandbox(backend, "sbx_login", "bash -l -c 'echo $PATH'").strip()
        # the host's unmodified file, run in the same sandbox by the same uid
        host_path = run_in_sandbox(backend, "sbx_login", f"bash --noprofile --norc -c {shlex.quote(original + '\necho $PATH')}")
        writable = run_in_sandbox(backend, "sbx_login", "echo x >> /etc/profile 2>/dev/null && echo writable || echo read-only")
    finally:
        backend.kill("sbx_login")
    assert "id -u" not in traced and "EUID" in Path(backend.login_profile or "").read_text()
    assert login_path == host_path.strip().splitlines()[-1] and "/usr/bin" in login_path
    assert writable.strip() == "read-only"
