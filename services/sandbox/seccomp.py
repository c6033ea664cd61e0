"""A seccomp deny-list for untrusted code, as the classic BPF program bubblewrap's ``--seccomp FD`` loads.

Namespaces hide the host; this filter shrinks the kernel surface the sandboxed code can still
reach, to the syscalls container escapes are usually built on: keyrings, eBPF, perf, ptrace
and cross-process memory access, every mount-family call, module and kexec loading, new user
namespaces (``unshare``/``clone`` with CLONE_NEWUSER; ``clone3`` hides its flags in memory a
filter cannot read, so it answers ENOSYS and libc falls back to ``clone`` — Docker's default
profile does the same), ``setns``, userfaultfd, io_uring, swap, reboot, file handles, quota,
process accounting, the clock and the kernel log. Each answers EPERM; everything else is
allowed. Denying by name is a deny-list, not an allow-list: it keeps any ordinary program
working and closes the known doors.

The filter checks the architecture first: x86_64 and aarch64 have their own tables, x32
calls on x86_64 are refused, and any other architecture (an i386 ``int 0x80`` from an x86_64
process included) kills the process. No libseccomp here: the program is ~120 instructions
of struct packing, so it is generated below (the numbers are the kernel's uapi tables).

:func:`disable_userns_flags` adds bubblewrap's own ``--disable-userns`` where it exists, so a
new user namespace is refused twice over (the filter answers first, with EPERM).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import subprocess
from functools import cache

log = logging.getLogger("rsigym.sandbox")

# BPF opcodes (linux/bpf_common.h)
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K

# linux/seccomp.h
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

# linux/audit.h: EM_* | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little endian)
_OFF_NR, _OFF_ARCH, _OFF_ARG0_LO = 0, 4, 16

DENIED = (
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "open_tree_attr", "fsopen", "fsmount", "fsconfig",
    "fspick", "mount_setattr",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "setns", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "swapon", "swapoff", "reboot", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
    "quotactl", "quotactl_fd", "acct", "settimeofday", "clock_settime", "adjtimex", "clock_adjtime", "syslog",
)
"""Refused outright (EPERM)."""
NO_NEW_USERNS = ("unshare", "clone")
"""Refused (EPERM) when flags (the first argument on both architectures) ask for CLONE_NEWUSER."""
ENOSYS_CALLS = ("clone3",)

SYSCALLS: dict[int, dict[str, int]] = {
    AUDIT_ARCH_X86_64: {
        "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
        "mount": 165, "umount2": 166, "pivot_root": 155, "move_mount": 429, "open_tree": 428, "open_tree_attr": 467,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "unshare": 272, "clone": 56, "clone3": 435, "setns": 308, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "swapon": 167, "swapoff": 168, "reboot": 169, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "lookup_dcookie": 212, "quotactl": 179, "quotactl_fd": 443, "acct": 163, "settimeofday": 164,
        "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305, "syslog": 103,
    },
    AUDIT_ARCH_AARCH64: {  # asm-generic/unistd.h
        "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
        "mount": 40, "umount2": 39, "pivot_root": 41, "move_mount": 429, "open_tree": 428, "open_tree_attr": 467,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "unshare": 97, "clone": 220, "clone3": 435, "setns": 268, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "swapon": 224, "swapoff": 225, "reboot": 142, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "lookup_dcookie": 18, "quotactl": 60, "quotactl_fd": 443, "acct": 89, "settimeofday": 170,
        "clock_settime": 112, "adjtimex": 171, "clock_adjtime": 266, "syslog": 116,
    },
}


class _Program:
    """A tiny assembler: jumps name labels, resolved to BPF's relative 8-bit offsets at the end."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ops)

    def op(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.ops.append((code, jt, jf, k))

    def assemble(self) -> bytes:
        out = []
        for i, (code, jt, jf, k) in enumerate(self.ops):
            offsets = []
            for target in (jt, jf):
                offset = self.labels[target] - i - 1 if isinstance(target, str) else target
                if not 0 <= offset <= 255:
                    raise ValueError(f"seccomp: jump {offset} out of range at instruction {i}")
                offsets.append(offset)
            out.append(struct.pack("=HBBI", code, offsets[0], offsets[1], k))
        return b"".join(out)


@cache
def deny_filter() -> bytes:
    """The compiled filter: an array of ``struct sock_filter`` (8 bytes each)."""
    p = _Program()
    p.op(_LD_W_ABS, _OFF_ARCH)
    arches = list(SYSCALLS)
    for n, arch in enumerate(arches):
        p.op(_JEQ_K, arch, f"arch{n}", 0)
    p.op(_RET_K, RET_KILL_PROCESS)
    for n, arch in enumerate(arches):
        table = SYSCALLS[arch]
        p.label(f"arch{n}")
        p.op(_LD_W_ABS, _OFF_NR)
        if arch == AUDIT_ARCH_X86_64:
            p.op(_JGE_K, X32_SYSCALL_BIT, "eperm", 0)
        for name in DENIED:
            p.op(_JEQ_K, table[name], "eperm", 0)
        for name in ENOSYS_CALLS:
            p.op(_JEQ_K, table[name], "enosys", 0)
        for name in NO_NEW_USERNS:
            p.op(_JEQ_K, table[name], "check_userns", 0)
        p.op(_RET_K, RET_ALLOW)
    p.label("check_userns")
    p.op(_LD_W_ABS, _OFF_ARG0_LO)
    p.op(_JSET_K, CLONE_NEWUSER, "eperm", 0)
    p.op(_RET_K, RET_ALLOW)
    p.label("eperm")
    p.op(_RET_K, RET_ERRNO | errno.EPERM)
    p.label("enosys")
    p.op(_RET_K, RET_ERRNO | errno.ENOSYS)
    return p.assemble()


def filter_fd() -> int:
    """A readable fd holding the filter, for ``bwrap --seccomp FD`` (pass it in ``pass_fds``; the
    caller closes it after starting bubblewrap). A pipe: the program (~1 KiB) fits its buffer."""
    program = deny_filter()
    r, w = os.pipe()
    try:
        os.write(w, program)
    finally:
        os.close(w)
    return r


@cache
def disable_userns_flags(bwrap: str) -> tuple[str, ...]:
    """``--disable-userns`` where this bubblewrap knows it (0.8.0+); older ones rely on the
    seccomp filter alone, which refuses unshare/clone with CLONE_NEWUSER (and clone3) as well."""
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if "--disable-userns" in usage:
        return ("--disable-userns",)
    log.warning("%s has no --disable-userns (bubblewrap < 0.8): user namespaces are refused by seccomp only", bwrap)
    return ()
