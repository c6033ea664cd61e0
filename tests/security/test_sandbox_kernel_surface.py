"""What a local sandbox may not ask of the kernel: new user namespaces, keyrings, eBPF, perf,
mounts, ptrace of a sibling — each refused with EPERM — and how much CPU it may take (its
cgroup's cpu quota, where the host offers a writable cpu controller). Ordinary programs,
threads and child processes keep working."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.conftest import create_key
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

# Runs inside the sandbox (its python3, whatever version): every attempt reports "ok" or the errno name.
ATTACKS = r'''
import ctypes, ctypes.util, errno, json, os, platform, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": dict(keyctl=250, add_key=248, bpf=321, perf_event_open=298, ptrace=101, mount=165, unshare=272,
                     setns=308, io_uring_setup=425, process_vm_readv=310),
      "aarch64": dict(keyctl=219, add_key=217, bpf=280, perf_event_open=241, ptrace=117, mount=40, unshare=97,
                      setns=268, io_uring_setup=425, process_vm_readv=270)}[platform.machine()]
L = ctypes.c_long

def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(NR[name]), *args)
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))

out = {}
# a new user namespace (the first step of nearly every unprivileged escape): CLI here, syscall last
p = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True)
out["unshare -U"] = ("ok" if p.returncode == 0
                     else "EPERM" if "Operation not permitted" in p.stderr else p.stderr.strip())
p = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /tmp && echo mounted"],
                   capture_output=True, text=True)
out["unshare -Urm mount"] = ("ok" if "mounted" in p.stdout
                             else "EPERM" if "Operation not permitted" in p.stderr else p.stderr.strip())
# keyrings: KEYCTL_GET_KEYRING_ID of the session keyring (create it), and add_key
out["keyctl"] = call("keyctl", L(0), L(-3), L(1))
C = ctypes.c_char_p
out["add_key"] = call("add_key", C(b"user"), C(b"rsigym"), C(b"x"), L(1), L(-3))
# eBPF: BPF_MAP_CREATE of a one-entry array map
attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)
out["bpf"] = call("bpf", L(0), ctypes.byref(attr), L(ctypes.sizeof(attr)))
# perf: a software cpu-clock counter on ourselves, kernel and hypervisor excluded
pattr = (ctypes.c_uint8 * 128)()
ctypes.c_uint32.from_buffer(pattr, 0).value = 1  # PERF_TYPE_SOFTWARE
ctypes.c_uint32.from_buffer(pattr, 4).value = 128  # size
ctypes.c_uint64.from_buffer(pattr, 40).value = (1 << 5) | (1 << 6)  # exclude_kernel | exclude_hv
out["perf_event_open"] = call("perf_event_open", ctypes.byref(pattr), L(0), L(-1), L(-1), L(0))
# mounts: a tmpfs over /tmp
out["mount"] = call("mount", C(b"none"), C(b"/tmp"), C(b"tmpfs"), L(0), None)
# a sibling: attach to it, read its memory
sibling = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
time.sleep(0.2)
out["ptrace(sibling)"] = call("ptrace", L(16), L(sibling.pid), None, None)  # PTRACE_ATTACH
buf = ctypes.create_string_buffer(8)
local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
remote = (ctypes.c_void_p * 2)(0x400000, 8)
r = call("process_vm_readv", L(sibling.pid), ctypes.byref(local), L(1), ctypes.byref(remote), L(1), L(0))
out["process_vm_readv(sibling)"] = "ok" if r in ("ok", "EFAULT") else r  # EFAULT: it got past the access check
sibling.kill()
sibling.wait()
out["setns"] = call("setns", L(os.open("/proc/self/ns/mnt", os.O_RDONLY)), L(0))
params = (ctypes.c_uint8 * 120)()
out["io_uring_setup"] = call("io_uring_setup", L(1), ctypes.byref(params))
out["unshare(CLONE_NEWUSER)"] = call("unshare", L(0x10000000))  # last: on success we would be in it
print(json.dumps(out))
'''

ORDINARY = r'''
set -e
python3 - <<'EOF'
import subprocess, threading, concurrent.futures, multiprocessing
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    assert sum(pool.map(lambda n: n * n, range(10))) == 285
assert subprocess.run(["echo", "child"], capture_output=True, text=True).stdout == "child\n"
with multiprocessing.Pool(2) as pool:
    assert pool.map(abs, [-1, -2]) == [1, 2]
print("python ok")
EOF
seq 1 1000 | sort -rn | head -1
for i in 1 2 3; do (echo forked $i) & done; wait
'''


@pytest.fixture
def env(gym: Any) -> Iterator[dict[str, Any]]:
    with serve_gym(gym) as url, httpx.Client(base_url=url) as client:
        key = create_key(client, budget_usd=1.0)["key"]
        opts = {"api_key": key, "api_url": f"{url}/sandbox", "sandbox_url": f"{url}/sandbox/envd"}
        backend = gym.service_apps["sandbox"].state.sandbox.backend
        yield {"opts": opts, "gym": gym, "backend": backend}


def test_escape_syscalls_are_refused_and_ordinary_programs_work(env: dict[str, Any]) -> None:
    sbx = Sandbox.create(template="base", timeout=120, **env["opts"])
    try:
        sbx.files.write("/home/user/attacks.py", ATTACKS)
        r = sbx.commands.run("python3 /home/user/attacks.py", timeout=60, request_timeout=90)
        got = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"\nfrom inside the sandbox: {got}")
        assert got == {name: "EPERM" for name in got}, {k: v for k, v in got.items() if v != "EPERM"}
        assert len(got) == 12
        r = sbx.commands.run(ORDINARY, timeout=60, request_timeout=90)
        assert r.exit_code == 0, r.stderr
        assert "python ok" in r.stdout and "1000" in r.stdout and r.stdout.count("forked") == 3, r.stdout
    finally:
        sbx.kill()


def _writable_cpu_controller() -> str | None:
    """Whether this host lets the gym create a cpu cgroup ("v1"/"v2"), probed independently of the backend."""
    root, own = Path("/sys/fs/cgroup"), {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            own[c] = path.lstrip("/")
    if (root / "cpu").is_dir():
        parent, kind, knob = root / "cpu" / own.get("cpu", ""), "v1", "cpu.cfs_quota_us"
    elif (root / "cgroup.controllers").is_file():
        parent, kind, knob = root / own.get("", ""), "v2", "cpu.max"
    else:
        return None
    probe = parent / f"rsigym-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return None
    try:
        return kind if os.access(probe / knob, os.W_OK) else None
    finally:
        probe.rmdir()


def test_each_sandbox_gets_a_cpu_quota_from_its_template(env: dict[str, Any]) -> None:
    kind = _writable_cpu_controller()
    if kind is None:
        pytest.skip("no writable cgroup cpu controller on this host: RLIMIT_CPU per process is the only CPU bound")
    cpus = env["gym"].gateway.config.sandbox.template("base").cpu_count
    sbx = Sandbox.create(template="base", timeout=120, **env["opts"])
    try:
        assert sbx.commands.run("echo up").stdout.strip() == "up"
        pid = env["backend"]._sandboxes[sbx.sandbox_id].process.pid  # bubblewrap, the sandbox's first process
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        if kind == "v1":
            path = next(line.split(":", 2)[2] for line in lines if "cpu" in line.split(":")[1].split(","))
            d = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
            quota, period = int((d / "cpu.cfs_quota_us").read_text()), int((d / "cpu.cfs_period_us").read_text())
        else:
            path = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
            quota_s, period_s = (Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max").read_text().split()
            quota, period = int(quota_s) if quota_s != "max" else -1, int(period_s)
        print(f"\ncgroup {kind} {path}: cpu quota {quota} per {period} us")
        assert sbx.sandbox_id in path
        assert quota == cpus * period
    finally:
        sbx.kill()


def _run_bpf(program: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """Interpret the classic BPF program (the subset seccomp filters use) on one seccomp_data."""
    import struct

    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    ops = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


def test_the_filter_program_per_architecture() -> None:
    from services.sandbox import seccomp

    prog = seccomp.deny_filter()
    eperm, enosys = seccomp.RET_ERRNO | 1, seccomp.RET_ERRNO | 38
    for arch, table in seccomp.SYSCALLS.items():
        for name in seccomp.DENIED:
            assert _run_bpf(prog, arch, table[name]) == eperm, name
        assert _run_bpf(prog, arch, table["clone3"]) == enosys
        for name in ("unshare", "clone"):
            assert _run_bpf(prog, arch, table[name], seccomp.CLONE_NEWUSER | 0x11) == eperm
            assert _run_bpf(prog, arch, table[name], 0x01200011) == seccomp.RET_ALLOW  # what fork() passes
    assert _run_bpf(prog, seccomp.AUDIT_ARCH_X86_64, 0) == seccomp.RET_ALLOW  # read
    assert _run_bpf(prog, seccomp.AUDIT_ARCH_X86_64, 59) == seccomp.RET_ALLOW  # execve
    assert _run_bpf(prog, seccomp.AUDIT_ARCH_AARCH64, 221) == seccomp.RET_ALLOW  # execve
    assert _run_bpf(prog, seccomp.AUDIT_ARCH_X86_64, seccomp.X32_SYSCALL_BIT | 250) == eperm  # x32 ABI
    assert _run_bpf(prog, 0x40000003, 1) == seccomp.RET_KILL_PROCESS  # i386 (int 0x80): unknown arch
