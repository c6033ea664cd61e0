"""The supervisor follows its run at the gateway (ops/run_watch.py): frozen while paused, thawed
on resume, killed when the run ends there, stopped at the wall clock by its own count when the
gateway does not answer (not counting frozen time)."""

from __future__ import annotations

import asyncio
from typing import Any

from ops.run_watch import Outcome, follow


class Box:
    def __init__(self, agent: asyncio.Future[int]):
        self.agent, self.calls = agent, []

    async def freeze(self) -> None:
        self.calls.append("freeze")

    async def thaw(self) -> None:
        self.calls.append("thaw")

    async def kill(self) -> None:
        self.calls.append("kill")
        if not self.agent.done():
            self.agent.set_result(-9)


class Gateway:
    """Answers the views it is given, one per poll, then keeps answering the last."""

    def __init__(self, *views: dict[str, Any] | None):
        self.views = list(views)

    async def view(self) -> dict[str, Any] | None:
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    async def start(self) -> None:
        pass


RUNNING = {"ended": False, "state_name": "running", "time_left_s": 100.0}
PAUSED = {"ended": False, "state_name": "paused", "time_left_s": 100.0}


def _follow(gateway: Gateway, seconds: float = 100.0, *, exit_after: int | None = None,
            clock_step: float = 0.0) -> tuple[Outcome, list[str]]:
    async def go() -> tuple[Outcome, list[str]]:
        agent: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        box, now = Box(agent), [0.0]

        def clock() -> float:
            now[0] += clock_step
            return now[0]

        if exit_after is not None:
            asyncio.get_running_loop().call_later(exit_after * 0.01 + 0.005, agent.set_result, 0)
        return await follow(agent, box, gateway, seconds, poll_s=0.01, clock=clock), box.calls

    return asyncio.run(go())


def test_an_agent_that_exits_on_its_own() -> None:
    outcome, calls = _follow(Gateway(RUNNING), exit_after=3)
    assert outcome == Outcome(0) and calls == []


def test_frozen_while_paused_thawed_on_resume() -> None:
    outcome, calls = _follow(Gateway(RUNNING, PAUSED, PAUSED, RUNNING, RUNNING), exit_after=8)
    assert outcome == Outcome(0) and calls == ["freeze", "thaw"]


def test_killed_when_the_run_ends_at_the_gateway() -> None:
    stopped = {"ended": True, "end_reason": "stopped", "state_name": "ended"}
    outcome, calls = _follow(Gateway(RUNNING, PAUSED, stopped))
    assert outcome == Outcome(None, "stopped") and calls == ["freeze", "kill", "thaw"]
    deadline = {"ended": True, "end_reason": "deadline", "state_name": "ended"}
    assert _follow(Gateway(deadline))[0] == Outcome(124, "deadline")


def test_the_wall_clock_without_the_gateway_not_counting_frozen_time() -> None:
    outcome, calls = _follow(Gateway(None), seconds=1.0, clock_step=0.1)
    assert outcome == Outcome(124, "deadline") and calls == ["kill"]
    # the gateway said paused, then went away: the frozen agent's clock does not run
    outcome, calls = _follow(Gateway(PAUSED, None), seconds=1.0, clock_step=1.0, exit_after=20)
    assert outcome == Outcome(0) and calls == ["freeze", "thaw"]
