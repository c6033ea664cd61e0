"""The gym's handle on a sandbox's PID-namespace init: kill it, then wait until the namespace is empty.

When the init of a PID namespace exits, the kernel SIGKILLs every other process of the namespace
and waits until they are all gone before it reports the init's own exit (``zap_pid_ns_processes``,
called from the init's ``exit_notify`` before its parent or its pidfd hear of it). So a pidfd on
the init turning readable means that nothing of the sandbox runs any more, which is what a sweep of
``/proc`` for the sandbox's uid established after every kill (~2.5 ms of each kill, two kills per
evaluation trial). The sweep stays as the fallback wherever this handle is missing or its wait
runs out.

bubblewrap names its init in the JSON it writes to ``--info-fd``: ``child-pid`` (a host pid) and
``pid-namespace`` (the namespace's inode). A pid can be reused once its process is gone, so the
handle is kept only if, after the pidfd is open, ``/proc/<pid>/ns/pid`` is that namespace and the
process has not exited: the pidfd then holds that very process, whatever the pid later names.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
from pathlib import Path

log = logging.getLogger("rsigym.sandbox")


class NamespaceInit:
    __slots__ = ("pid", "_fd")

    def __init__(self, pid: int, fd: int):
        self.pid = pid
        self._fd: int | None = fd

    @classmethod
    def from_info(cls, info_path: Path) -> NamespaceInit | None:
        """The init named in bubblewrap's ``--info-fd`` output; None when it cannot be held for
        certain (the caller then sweeps by uid)."""
        try:
            info = json.loads(info_path.read_bytes())
            pid, namespace = int(info["child-pid"]), int(info["pid-namespace"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.debug("no namespace init from %s: %s", info_path, err)
            return None
        try:
            fd = os.pidfd_open(pid)
        except (OSError, OverflowError) as err:
            log.debug("no pidfd for namespace init %d: %s", pid, err)
            return None
        held = cls(pid, fd)
        try:
            same = os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace
        except OSError:
            same = False
        if not same or held._exited(0):
            held.close()
            return None
        return held

    def kill(self) -> None:
        """SIGKILL the init; the kernel then kills the rest of its namespace."""
        if self._fd is None:
            return
        try:
            signal.pidfd_send_signal(self._fd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait_gone(self, timeout_s: float) -> bool:
        """True once the init has exited, and with it every process of its namespace; False if
        that did not happen within ``timeout_s``."""
        return self._fd is not None and self._exited(timeout_s)

    def _exited(self, timeout_s: float) -> bool:
        assert self._fd is not None
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout_s * 1000))))

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
