"""A host-wide pool of unprivileged uids for untrusted code (local sandboxes, custom losses, launched
agents), and how a privileged bubblewrap drops its command to one (:func:`bwrap_drop`).

Each uid is claimed with an flock on ``/tmp/rsigym-sandbox-uids/<uid>``, held for as long as
the code runs as it, so two gyms on one host (or two pools in one process: an flock belongs to
an open file, not to a process) never hand out the same uid. A uid that still owns processes
(the leftover of a crashed gym) is skipped. Only meaningful when the gym runs as root.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from pathlib import Path

from kit.errors import ServiceUnavailable

UID_LOCKS = Path("/tmp/rsigym-sandbox-uids")
POOL_SIZE = 10_000
DROP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
"""All setpriv needs, inside a privileged bubblewrap, to drop to a uid and empty its bounding set."""


def bwrap_drop(uid: int) -> tuple[list[str], list[str]]:
    """(bubblewrap's flags, the command's prefix inside) that run a command as ``uid`` with no
    capability at all, an empty bounding set, no supplementary groups and no_new_privs (setuid
    binaries stay unprivileged), from a bubblewrap started as root *without* a user namespace: one
    would map its processes to root and give them every capability over their own mounts (a
    read-only bind is then remounted read-write). bubblewrap keeps only the three capabilities
    setpriv needs; setpriv drops them with the uid change."""
    flags = ["--cap-drop", "ALL", *(a for cap in DROP_CAPS for a in ("--cap-add", cap))]
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
              "--inh-caps=-all", "--bounding-set=-all", "--"]
    return flags, prefix


class HostUidPool:
    def __init__(self, base: int):
        self.base = base
        self._held: dict[int, int] = {}
        """uid → the fd of its host-wide lock file."""
        self._lock = threading.Lock()

    def take(self) -> int:
        """A uid in base … base + POOL_SIZE - 1 that nothing else on this host runs as."""
        UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
        with self._lock:
            for uid in range(self.base, self.base + POOL_SIZE):
                if uid in self._held:
                    continue
                fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                if pids_of_uid(uid):  # a leftover of a crashed gym: leave that uid alone
                    os.close(fd)
                    continue
                self._held[uid] = fd
                return uid
        raise ServiceUnavailable("no free sandbox uid on this host")

    def free(self, uid: int | None) -> None:
        if uid is None:
            return
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # releases the flock


def pid_running(pid: int) -> bool:
    """Whether a process of this pid runs on this host (one of another user's counts; a zombie,
    killed and not yet waited for, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return not _zombie(str(pid))
    except (OSError, IndexError):
        return True


def pids_of_uid(uid: int) -> list[int]:
    """Live processes running as ``uid``. Zombies are not counted: they run nothing, hold nothing
    and cannot be signalled, and a sandbox's are reaped by whoever it was reparented to (here
    PID 1), which may take a while — counting them made every kill wait out its retries."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid and not _zombie(entry):
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _zombie(pid: str) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def kill_uid(uid: int, *, wait_s: float = 0.5) -> None:
    """SIGKILL every process still running as ``uid``, until none is left or ``wait_s`` passed
    (a killed process takes a moment to go). Through a pidfd, checked after it is opened: a pid
    listed a moment ago may already belong to another sandbox's process (pids are reused
    quickly on a busy host), and that one must not be hit."""
    deadline, pause = time.monotonic() + wait_s, 0.001
    while pids := pids_of_uid(uid):
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
        if time.monotonic() >= deadline:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
