"""Custom losses run outside the training process, with nothing to read, steal or write.

The trainer computes logits; a separate process runs the agent's ``loss(logits, labels, mask)``
and sends back the loss and its gradient with respect to the logits, which the trainer
backpropagates (Tinker's forward_backward_custom shape). That process lives in bubblewrap's
fresh mount, PID, network, IPC and UTS namespaces with an empty environment, and its root
holds only what the loss needs, read-only: /usr and the /bin, /lib … links into it, the
dynamic loader's cache, the interpreter (``sys.base_prefix``) and the venv with torch
(``sys.prefix``) — plus its own scratch dir at /tmp/work, the one writable place, removed
afterwards. No /home, /root (beyond the path down to the interpreter), /etc, data dir or
checkout: the platform's credentials, other runs' files and .env files are not there at all.
The seccomp deny-list of the local sandboxes (services/sandbox/seccomp.py) applies too.

Uid: when the gym runs as root, bubblewrap runs privileged *without* a user namespace (a
user namespace would map the loss to root and let it read whatever root can), builds the
binds, keeps only CAP_SETUID/SETGID/SETPCAP, and ``setpriv`` inside drops to a uid of the
host-wide pool the local sandboxes use (kit/host_uids.py) — all capabilities, the
bounding set and supplementary groups go, no_new_privs is set. When the gym is not root,
bubblewrap runs unprivileged in a user namespace (``--disable-userns`` where supported) with
the same binds; the loss then runs as the gym's own uid, which the minimal root still keeps
away from the gym's files.

Its wall time is the worker's time, so it is metered: each call's seconds (from the sandbox's
start to the loss's answer) are billed at ``[training] custom_loss_usd_per_hour`` with the step
(services/training/trainer.py reserves the cap's worth first), and a call longer than the
per-step cap (``custom_loss_timeout_s``) is killed and fails the job, billed for the cap.

What comes back on failure is the last line of the loss's stderr only (its exception),
redacted like a log line and truncated: whatever the loss prints cannot be smuggled out
in bulk.
"""

from __future__ import annotations

import io
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.config import SandboxConfig
from kit.errors import Unprocessable
from kit.host_uids import HostUidPool, bwrap_drop, kill_uid
from kit.private_files import write_private
from kit.redact import redact
from services.sandbox import seccomp
from services.sandbox.metering import nusd_per_second

RUNNER = r'''
import io, sys, torch
ns = {}
exec(compile(open(sys.argv[1]).read(), "custom_loss.py", "exec"), ns)
data = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=True)
logits = data["logits"].requires_grad_(True)
loss = ns["loss"](logits, data["labels"], data["mask"])
if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
    raise SystemExit("loss() must return a scalar tensor")
loss.backward()
out = io.BytesIO()
torch.save({"loss": loss.detach(), "grad": logits.grad}, out)
sys.stdout.buffer.write(out.getvalue())
'''
MAX_ERROR_CHARS = 300
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Bound read-only when they are directories, recreated as links when (usr-merge) they are links."""
DEFAULT_UID_BASE = SandboxConfig.model_fields["uid_base"].default


class CustomLossError(Exception):
    """The agent's loss failed this step; the message is safe to show to the agent."""


def _system_binds() -> list[str]:
    argv = ["--ro-bind", "/usr", "/usr"]
    for path in SYSTEM_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    if os.path.exists("/etc/ld.so.cache"):
        argv += ["--perms", "0755", "--dir", "/etc", "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for prefix in dict.fromkeys((sys.base_prefix, sys.prefix)):  # the interpreter, then the venv over it
        # bubblewrap would create the dirs down to a bind 0700, closed to the loss uid; these are empty
        for parent in reversed(Path(prefix).parents[:-1]):
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", prefix, prefix]
    return argv


def sandbox_command(scratch: Path, argv: list[str], *, uid: int | None, filter_fd: int,
                    hidden: Sequence[Path] = ()) -> list[str]:
    """bubblewrap around ``argv``: privileged with a setpriv drop to ``uid`` when given (the gym is
    root), else unprivileged in a user namespace. ``hidden``: host paths masked should they lie
    under one of the binds (the gym's data dir)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise Unprocessable("custom losses need bubblewrap (bwrap) on the training host", param="loss")
    cmd = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
           "--unshare-uts", "--unshare-cgroup-try", "--clearenv"]
    drop_flags, drop_prefix = bwrap_drop(uid) if uid is not None else ([], [])
    if uid is None:
        cmd += ["--unshare-user", *seccomp.disable_userns_flags(bwrap)]
    cmd += drop_flags
    # /tmp first: the interpreter or the venv may live under it (a checkout in /tmp), and a tmpfs
    # mounted over /tmp after their binds would hide them.
    cmd += ["--tmpfs", "/tmp", *_system_binds()]
    binds = [Path(p) for p in (sys.base_prefix, sys.prefix)]
    for path in hidden:
        if any(Path(path).is_relative_to(b) for b in binds):
            cmd += ["--tmpfs", str(path), "--remount-ro", str(path)] if Path(path).is_dir() else \
                   ["--ro-bind", "/dev/null", str(path)]
    cmd += ["--dev", "/dev", "--proc", "/proc", "--bind", str(scratch), "/tmp/work",
            "--remount-ro", "/tmp", "--remount-ro", "/", "--chdir", "/tmp/work",
            "--setenv", "HOME", "/tmp/work", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--setenv", "PATH", "/usr/bin:/bin", "--seccomp", str(filter_fd), "--"]
    return cmd + drop_prefix + argv


def failure_message(returncode: int, stderr: bytes) -> str:
    """What the agent is told: the last line the loss wrote (its exception), redacted, truncated."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    last = redact(lines[-1]) if lines else f"exit status {returncode}"
    if len(last) > MAX_ERROR_CHARS:
        last = last[:MAX_ERROR_CHARS] + "…"
    return "custom loss failed: " + last


class LossSandbox:
    def __init__(self, source: str, timeout_s: float, hidden: list[Path], uid_base: int = DEFAULT_UID_BASE,
                 scratch_root: Path | None = None, usd_per_hour: float = 0.0):
        """``hidden``: host paths masked inside the sandbox (the gym's data dir), should a bind
        cover them. ``uid_base``: the host-wide sandbox uid pool's (``[sandbox] uid_base``).
        ``scratch_root``: where each call's work dir is made (RSIGYM_SCRATCH_DIR; default $TMPDIR)."""
        self.scratch_root = scratch_root
        self.source = source
        self.timeout_s = timeout_s
        self.hidden = [p for p in hidden if Path(p).exists()]
        self.uids = HostUidPool(uid_base) if os.geteuid() == 0 else None
        self.price_nusd_per_s = nusd_per_second(usd_per_hour)
        """``usd_per_hour``: the price of the loss's wall time; ``timeout_s`` is the per-step cap."""
        self._seconds = 0.0

    def cost_nusd(self, seconds: float) -> int:
        return math.ceil(self.price_nusd_per_s * min(seconds, self.timeout_s))

    @property
    def cap_nusd(self) -> int:
        """The most one step's loss can cost (what the step reserves for it)."""
        return self.cost_nusd(self.timeout_s)

    def take_seconds(self) -> float:
        """Wall seconds the loss ran since the last call (at most the cap per call)."""
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    def __call__(self, logits: Any, labels: Any, mask: Any) -> tuple[Any, Any]:
        import torch

        buf = io.BytesIO()
        torch.save({"logits": logits.detach().float().cpu(), "labels": labels.cpu(), "mask": mask.cpu()}, buf)
        outer = Path(tempfile.mkdtemp(prefix="rsigym-loss-", dir=self.scratch_root))  # 0700: no other host user gets in
        scratch = outer / "work"
        filter_fd = seccomp.filter_fd()
        uid: int | None = None
        try:
            uid = self.uids.take() if self.uids is not None else None
            scratch.mkdir()
            write_private(scratch / "custom_loss.py", self.source)  # the run's code: its uid's alone (below)
            write_private(scratch / "runner.py", RUNNER)
            if uid is not None:  # the loss's own dir, writable by its uid; o+x lets capless bwrap chdir into it
                for path in scratch.iterdir():
                    os.chown(path, uid, uid)
                os.chown(scratch, uid, uid)
                os.chmod(scratch, 0o711)
            argv = sandbox_command(scratch, [sys.executable, "-I", "/tmp/work/runner.py", "/tmp/work/custom_loss.py"],
                                   uid=uid, filter_fd=filter_fd, hidden=self.hidden)
            started = time.monotonic()
            try:
                done = subprocess.run(argv, input=buf.getvalue(), capture_output=True, timeout=self.timeout_s,
                                      env={}, check=False, pass_fds=(filter_fd,))
            except subprocess.TimeoutExpired:
                raise CustomLossError(
                    f"custom loss exceeded the per-step cap of {self.timeout_s:g} s (custom_loss_timeout_s) and was "
                    f"stopped; the step's {self.timeout_s:g} s were billed") from None
            finally:
                self._seconds += min(time.monotonic() - started, self.timeout_s)
            if done.returncode != 0:
                raise CustomLossError(failure_message(done.returncode, done.stderr))
            out = torch.load(io.BytesIO(done.stdout), weights_only=True)
            return out["loss"], out["grad"]
        finally:
            os.close(filter_fd)
            if uid is not None and self.uids is not None:
                kill_uid(uid)  # the PID namespace took them with bubblewrap; belt and braces
                self.uids.free(uid)
            shutil.rmtree(outer, ignore_errors=True)
