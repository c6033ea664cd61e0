"""A pids cgroup per local sandbox, where the host lets us write one (v2 or v1).

Rlimits bound each process; the cgroup bounds the sandbox's whole process tree (pids.max),
also when the gym does not run as root and sandboxes share a uid. Containers often mount
cgroups read-only or not at all, so this is best effort: without a writable hierarchy the
per-sandbox uid's RLIMIT_NPROC remains the process cap.

Memory is bounded per process (RLIMIT_AS) times the process cap, not by a memory cgroup:
measured here, a cgroup-v1 memory limit of 1 GiB OOM-killed 2 of 480 trial sandboxes whose
processes used ~12 MiB, because v1 charges the page cache of every file a sandbox reads or
writes to it (reading /usr/bin alone charged 450 MiB) and does not always reclaim it first.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("rsigym.sandbox")
ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> str | None:
    """This process's cgroup path for a v1 controller ('' for v2), from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


@dataclass
class SandboxCgroup:
    dirs: list[Path]

    @classmethod
    def create(cls, name: str, max_processes: int) -> SandboxCgroup | None:
        try:
            return cls._create(name, max_processes)
        except OSError as err:
            log.debug("no cgroup for sandbox %s: %s", name, err)
            return None

    @classmethod
    def _create(cls, name: str, max_processes: int) -> SandboxCgroup | None:
        v1 = ROOT / "pids"
        if v1.is_dir():
            d = v1 / (_own_path("pids") or "/").lstrip("/") / f"rsigym-{name}"
        elif (ROOT / "cgroup.controllers").is_file():
            d = ROOT / (_own_path("") or "/").lstrip("/") / f"rsigym-{name}"
        else:
            return None
        d.mkdir()
        try:
            (d / "pids.max").write_text(str(max_processes))
        except OSError:
            cls([d]).remove()
            raise
        return cls([d])

    def enter(self, pid: int) -> None:
        """Called in the child before exec: the sandbox's first process joins the cgroup."""
        for d in self.dirs:
            with open(d / "cgroup.procs", "w") as fh:
                fh.write(str(pid))

    def remove(self) -> None:
        for d in self.dirs:
            try:
                os.rmdir(d)
            except OSError as err:
                log.debug("cgroup %s not removed: %s", d, err)
