"""The launcher's supervisor follows its run at the gateway while the agent runs.

The gateway is the authority on a run's clock (access/lifecycle.py): a paused run's wall clock
stands still, and resuming pushes its deadline back by the pause's length. So every
:data:`POLL_S` the supervisor reads the run key's view with the operator's credentials and

* freezes the agent while the run is paused (every process of its sandbox stopped with SIGSTOP;
  compose: ``docker pause``) and thaws it on resume: a paused agent neither works nor burns its
  clock on refused calls;
* kills the agent once the run has ended at the gateway — its deadline, the operator's stop (the
  dashboard, ``rsigym keys``, another host's ``run stop``) or a revocation — and says why.

Should the gateway be unreachable, the supervisor counts the last time left it heard down itself,
not while the agent is frozen, and still stops the agent at the wall clock (the gateway refuses
the run key after its deadline regardless).
"""

from __future__ import annotations

import asyncio
import math
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from access.lifecycle import WALL_CLOCK_EXIT

POLL_S = 1.0
"""How often the supervisor reads its run at the gateway (a pause or a stop takes effect within it)."""


class AgentBox(Protocol):
    """What the supervisor can do to the running agent's sandbox."""

    async def freeze(self) -> None: ...
    async def thaw(self) -> None: ...
    async def kill(self) -> None: ...


class RunAtGateway(Protocol):
    """The run key at the gateway: its view (``None``: the gateway did not answer), and the
    report that the agent has started."""

    async def view(self) -> dict[str, Any] | None: ...
    async def start(self) -> None: ...


@dataclass(frozen=True)
class Outcome:
    code: int | None
    """The agent's exit status (:data:`WALL_CLOCK_EXIT` when stopped at the wall clock; None when
    the run was ended at the gateway otherwise and the agent killed)."""
    reason: str | None = None
    """Why the run ended, where the gateway (or the wall clock) ended it; None: the agent exited
    on its own (access/lifecycle.py ``exit_reason`` says why)."""


def _say(message: str) -> None:
    print(f"rsigym: {message}", file=sys.stderr, flush=True)


async def follow(agent_exit: asyncio.Future[int], box: AgentBox, run: RunAtGateway, seconds: float,
                 poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Wait for the agent (``agent_exit``) while following its run at the gateway; see the module."""
    left, frozen, last = seconds, False, clock()
    try:
        while True:
            done, _ = await asyncio.wait({agent_exit}, timeout=poll_s)
            if done:
                return Outcome(agent_exit.result())
            now = clock()
            left, last = (left if frozen else left - (now - last)), now
            view = await run.view()
            if view is not None:
                if view.get("ended"):
                    reason = str(view.get("end_reason") or "stopped")
                    _say("the run's wall clock has passed; the agent is stopped" if reason == "deadline"
                         else f"the run has ended at the gateway ({reason}); the agent is stopped")
                    await box.kill()
                    return Outcome(WALL_CLOCK_EXIT if reason == "deadline" else None, reason)
                paused = view.get("state_name") == "paused"
                if paused != frozen:
                    await (box.freeze() if paused else box.thaw())
                    _say("the run is paused: the agent is frozen, its clock stopped" if paused
                         else "the run is resumed: the agent goes on")
                    frozen = paused
                left = math.inf if view.get("time_left_s") is None else float(view["time_left_s"])
            if left <= 0 and not frozen:
                _say("the run's wall clock has passed; the agent is stopped")
                await box.kill()
                return Outcome(WALL_CLOCK_EXIT, "deadline")
    finally:
        if frozen:
            await box.thaw()


class ProcessTreeBox:
    """An embedded run's sandbox: the bubblewrap process and everything under it (its PID
    namespace: nothing inside can leave the tree)."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    def _signal_all(self, sig: signal.Signals) -> None:
        """Signal every process of the tree, again until no new one appears (a process being
        stopped may have forked a moment before)."""
        seen: set[int] = set()
        while True:
            try:
                root = psutil.Process(self.proc.pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            fresh = [p for p in tree if p.pid not in seen]
            if not fresh:
                return
            for p in fresh:
                seen.add(p.pid)
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass

    async def freeze(self) -> None:
        self._signal_all(signal.SIGSTOP)

    async def thaw(self) -> None:
        self._signal_all(signal.SIGCONT)

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self._signal_all(signal.SIGCONT)
            self.proc.kill()  # bubblewrap; its PID namespace goes with it
            await self.proc.wait()


class AdminRun:
    """The run key's view through the operator's admin client (blocking httpx, run in a thread)."""

    def __init__(self, client: Any, key_id: str):
        self.client, self.key_id = client, key_id

    async def view(self) -> dict[str, Any] | None:
        try:
            return dict(await asyncio.to_thread(self.client.key, self.key_id))
        except (Exception, SystemExit):  # noqa: BLE001 - unreachable or refusing: count down locally
            return None

    async def start(self) -> None:
        """Tell the gateway the agent has started (``created`` → ``running``)."""
        try:
            await asyncio.to_thread(self.client.start_run, self.key_id)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - the run goes on; it just shows `created`
            _say(f"could not tell the gateway the agent started ({err})")
