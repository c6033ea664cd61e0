"""Sandbox kill: until none of the sandbox's processes runs, on the local backend alone.

Two ways, interleaved, N sandboxes each, every sandbox first given work that outlives its command
(three daemonised ``sleep``s in sessions of their own and a background one):
  * **init pidfd** — the backend's kill: SIGKILL to the PID namespace's init, then a wait on its
    pidfd (the kernel empties the namespace before that exit is reported);
  * **uid sweep** — the baseline, the kill as it was: the same sandbox with its init handle dropped,
    so the kill sweeps ``/proc`` for the sandbox's uid until nothing of it is left.
Both are checked: no process of the sandbox's uid is left when the kill returns.

    .venv/bin/python bench/sandbox_kill.py [--sandboxes 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from _common import ROOT, summary

from kit.config import SandboxTemplate
from kit.host_uids import pids_of_uid
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.local import LocalBackend

WORK = "for j in 1 2 3; do setsid sleep 1000 >/dev/null 2>&1 & done; (sleep 1000 >/dev/null 2>&1 &); true"


def one_kill(backend: LocalBackend, sandbox_id: str, *, sweep: bool) -> float:
    backend.create(SandboxSpec(sandbox_id, SandboxTemplate(name="base")))
    local = backend._sandboxes[sandbox_id]

    async def run() -> None:
        async for event in backend.stream(sandbox_id, {"op": "start", "cmd": "/bin/bash", "args": ["-c", WORK]}):
            if "end" in event:
                return

    asyncio.run(run())
    uid = local.uid
    if uid is not None and len(pids_of_uid(uid)) < 5:
        raise SystemExit(f"{sandbox_id}: its work did not start")
    if sweep:
        assert local.init is not None
        local.init.close()
        local.init = None
    t0 = time.perf_counter()
    backend.kill(sandbox_id)
    elapsed = time.perf_counter() - t0
    if uid is not None and (left := pids_of_uid(uid)):
        raise SystemExit(f"{sandbox_id}: {len(left)} processes left after the kill")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=30)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: sandboxes get uids of their own only then (the sweep needs one)")
    backend = LocalBackend(None, 234_000)
    pidfd, sweep = [], []
    try:
        one_kill(backend, "sbx_warmup", sweep=False)
        for i in range(args.sandboxes):  # interleaved, so load on the box hits both alike
            pidfd.append(one_kill(backend, f"sbx_pidfd{i}", sweep=False))
            sweep.append(one_kill(backend, f"sbx_sweep{i}", sweep=True))
    finally:
        backend.close()
    print(f"sandbox kill until no process of it runs, {args.sandboxes} sandboxes each (local backend alone)")
    print(f"  init pidfd (now)     : {summary(pidfd)}")
    print(f"  uid sweep (baseline) : {summary(sweep)}")
    print(f"  ratio p50 pidfd/sweep {sorted(pidfd)[len(pidfd) // 2] / sorted(sweep)[len(sweep) // 2]:.2f}x; "
          f"/proc entries now: {sum(e.isdigit() for e in os.listdir('/proc'))}")


if __name__ == "__main__":
    assert ROOT
    main()
