"""A cgroup per local sandbox, where the host lets us write one (v2 or v1 pids + memory).

Rlimits bound each process; a cgroup bounds the sandbox as a whole (all its processes'
memory together, its process count). Containers often mount cgroups read-only or not at
all, so this is best effort: without a writable hierarchy the per-sandbox uid's
RLIMIT_NPROC and each process's RLIMIT_AS remain the limits.
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
    def create(cls, name: str, max_processes: int, memory_mb: int) -> SandboxCgroup | None:
        try:
            return cls._create(name, max_processes, memory_mb)
        except OSError as err:
            log.debug("no cgroup for sandbox %s: %s", name, err)
            return None

    @classmethod
    def _create(cls, name: str, max_processes: int, memory_mb: int) -> SandboxCgroup | None:
        memory = memory_mb * 1024 * 1024
        v1_pids, v1_mem = ROOT / "pids", ROOT / "memory"
        if v1_pids.is_dir() and v1_mem.is_dir():
            made = []
            try:
                for base, controller, files in (
                    (v1_pids, "pids", {"pids.max": str(max_processes)}),
                    (v1_mem, "memory", {"memory.limit_in_bytes": str(memory), "memory.swappiness": "0"}),
                ):
                    own = (_own_path(controller) or "/").lstrip("/")
                    d = base / own / f"rsigym-{name}"
                    d.mkdir()
                    made.append(d)
                    for fname, value in files.items():
                        try:
                            (d / fname).write_text(value)
                        except OSError:
                            if fname != "memory.swappiness":
                                raise
            except OSError:
                cls(made).remove()
                raise
            return cls(made)
        if (ROOT / "cgroup.controllers").is_file():
            own = (_own_path("") or "/").lstrip("/")
            d = ROOT / own / f"rsigym-{name}"
            d.mkdir()
            try:
                (d / "pids.max").write_text(str(max_processes))
                (d / "memory.max").write_text(str(memory))
                (d / "memory.swap.max").write_text("0")
            except OSError:
                cls([d]).remove()
                raise
            return cls([d])
        return None

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
