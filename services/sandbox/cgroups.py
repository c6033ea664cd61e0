"""A pids and a cpu cgroup per local sandbox, where the host lets us write them (v2 or v1).

Rlimits bound each process; the cgroup bounds the sandbox's whole process tree: pids.max caps
its processes (also when the gym does not run as root and sandboxes share a uid), and a CFS
quota of ``cpu_count`` CPUs (cpu.max on v2; cpu.cfs_quota_us / cpu.cfs_period_us on v1) caps
how much of the host's CPU it can take at once, however many processes it spreads over.
Containers often mount cgroups read-only or not at all, so each controller is best effort and
independent of the other. The fallback without a writable controller: for processes, the
per-sandbox uid's RLIMIT_NPROC; for CPU, only RLIMIT_CPU (CPU *seconds* per process) — a
sandbox can then keep up to max_processes CPUs busy until each process's RLIMIT_CPU runs out.

Memory is bounded per process (RLIMIT_AS) times the process cap, not by a memory cgroup:
measured here, a cgroup-v1 memory limit of 1 GiB OOM-killed 2 of 480 trial sandboxes whose
processes used ~12 MiB, because v1 charges the page cache of every file a sandbox reads or
writes to it (reading /usr/bin alone charged 450 MiB) and does not always reclaim it first.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("rsigym.sandbox")
ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
_WARNED: set[str] = set()
"""Controllers the operator has been told are missing (once per process)."""


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


def _limits(max_processes: int, cpu_count: int) -> dict[str, dict[str, dict[str, str]]]:
    """controller → {"v1": files to write, "v2": files to write}, in order."""
    quota = cpu_count * CPU_PERIOD_US
    return {
        "pids": {"v1": {"pids.max": str(max_processes)}, "v2": {"pids.max": str(max_processes)}},
        "cpu": {"v1": {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": str(quota)},
                "v2": {"cpu.max": f"{quota} {CPU_PERIOD_US}"}},
    }


@dataclass
class SandboxCgroup:
    dirs: list[Path]
    controllers: list[str] = field(default_factory=list)
    """The controllers whose limits were written (for the record and for tests)."""

    @classmethod
    def create(cls, name: str, max_processes: int, cpu_count: int = 1) -> SandboxCgroup | None:
        dirs: list[Path] = []
        applied: list[str] = []
        v2_dir: Path | None = None
        for controller, files in _limits(max_processes, cpu_count).items():
            try:
                if (ROOT / controller).is_dir():  # v1 (or hybrid): its own hierarchy
                    d = ROOT / controller / (_own_path(controller) or "/").lstrip("/") / f"rsigym-{name}"
                    _write_new(d, files["v1"])
                    dirs.append(d)
                elif (ROOT / "cgroup.controllers").is_file():  # v2: one dir for every controller
                    if v2_dir is None:
                        v2_dir = ROOT / (_own_path("") or "/").lstrip("/") / f"rsigym-{name}"
                        v2_dir.mkdir()
                        dirs.append(v2_dir)
                    for knob, value in files["v2"].items():  # missing when the parent does not delegate it
                        (v2_dir / knob).write_text(value)
                else:
                    continue
                applied.append(controller)
            except OSError as err:
                log.debug("no %s cgroup for sandbox %s: %s", controller, name, err)
        for controller in _limits(max_processes, cpu_count):
            if controller not in applied and controller not in _WARNED:
                _WARNED.add(controller)
                log.warning("no writable %s cgroup controller: sandboxes fall back to rlimits (%s)", controller,
                            "RLIMIT_CPU per process, no CPU share" if controller == "cpu" else "RLIMIT_NPROC per uid")
        if not applied:
            cls(dirs).remove()
            return None
        return cls(dirs, applied)

    def entering_argv(self) -> list[str]:
        """A command prefix: the first process joins the cgroup, then execs the rest of its
        argv — so it is in the cgroup before anything of the sandbox runs (exit 125 if it can't)."""
        script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'
        return ["/bin/sh", "-c", script, "rsigym-cgroup", str(len(self.dirs)), *(str(d / "cgroup.procs") for d in self.dirs)]

    def remove(self) -> None:
        for d in self.dirs:
            try:
                os.rmdir(d)
            except OSError as err:
                log.debug("cgroup %s not removed: %s", d, err)


def _write_new(d: Path, files: dict[str, str]) -> None:
    d.mkdir()
    try:
        for knob, value in files.items():
            (d / knob).write_text(value)
    except OSError:
        os.rmdir(d)
        raise
