"""``rsigym demo --generations N``: what it refuses before it starts a gym, and what it passes on
(the loop itself runs in tests/e2e/test_generations_loop.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ops import demo_generations
from ops.cli.main import app


@pytest.mark.parametrize("args", [["--generations", "0"], ["--generations", "2", "--walkthrough"],
                                  ["--generations", "2", "--model", "smollm2"], ["--generations", "2", "--agent", "x"]])
def test_a_loop_it_cannot_run_is_refused_before_any_gym_starts(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []
    monkeypatch.setattr(demo_generations, "run_generations_demo", lambda *a, **k: started.append((a, k)) or 0)
    result = CliRunner().invoke(app, ["demo", *args])
    assert result.exit_code == 2 and started == []


def test_the_loop_gets_its_generations_agent_and_shortening(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def fake(generations: int, **kwargs: Any) -> int:
        seen.update(kwargs, generations=generations)
        return 0

    monkeypatch.setattr(demo_generations, "run_generations_demo", fake)
    result = CliRunner().invoke(app, ["demo", "--generations", "3", "--agent", "dag", "--tasks-per-split", "4",
                                      "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen["generations"] == 3 and seen["agent"] == "dag" and seen["tasks_per_split"] == 4


def test_one_agent_per_generation() -> None:
    with pytest.raises(ValueError, match="one agent per generation"):
        demo_generations.run_generations_demo(3, agents=["baseline", "dag"])


@pytest.mark.parametrize("agent", ["baseline", "dag"])
def test_the_demo_agents_take_the_arguments_the_demos_pass(agent: str, tmp_path: Path) -> None:
    """``make demo AGENT=…`` and the loop pass these arguments (and the registry's command line:
    ``--model``/``--token-cap`` for the DAG agent); the agent's parser accepts them all (it then stops
    for want of an instruction, not on its arguments)."""
    import subprocess
    import sys

    from ops.demo_agent import AGENT_ARGS, SHORT_ARGS

    script = Path(__file__).resolve().parents[3] / "agent_container" / "agents" / f"{agent}.py"
    extra = ["--model", "lead", "--token-cap", "512"] if agent == "dag" else []
    for args in (AGENT_ARGS[agent], SHORT_ARGS[agent]):
        done = subprocess.run([sys.executable, "-I", str(script), *args, *extra], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=60, check=False)
        assert "usage:" not in done.stderr and "RSIGYM_INSTRUCTION" in done.stderr, done.stderr
