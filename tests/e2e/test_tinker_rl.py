"""The reference RL loop (agent_container/agents/examples/grpo_loop.py) with the unmodified
``tinker`` and ``e2b`` SDKs against an embedded gym: the tiny model on CPU, a fixed seed and an
easily learnt reward (the fraction of sampled tokens that are "1"); the mean reward rises within
a few steps, scored in a gym sandbox and in process."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.conftest import create_key
from tests.fakes.servers import serve_gym
from tests.fakes.tiny_lora import torch_threads

pytest.importorskip("tinker")
pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().parents[2] / "agent_container" / "agents" / "examples" / "grpo_loop.py"
ONE = 21  # the tiny tokenizer's id of "1" (the script's default prompts are in the same ids)


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpo_loop", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def served(make_gym: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    gym = make_gym()
    with torch_threads(1), serve_gym(gym) as url:
        # Over HTTP: an in-process TestClient's block would run the app's shutdown (its sandboxes' root goes).
        with httpx.Client(base_url=url) as admin:
            key = create_key(admin, budget_usd=5.0, track="joint")["key"]
        yield url, key


def _run(url: str, key: str, tmp_path: Path, *extra: str) -> list[dict[str, Any]]:
    out = tmp_path / "curve.json"
    curve: list[dict[str, Any]] = load_script().main(
        ["--url", url, "--key", key, "--steps", "10", "--group", "8", "--max-tokens", "8", "--lr", "1e-2",
         "--seed", "0", "--reward-params", json.dumps({"target": ONE}), "--out", str(out), *extra])
    assert json.loads(out.read_text())["curve"] == curve
    return curve


def _rises(curve: list[dict[str, Any]]) -> None:
    rewards = [row["mean_reward"] for row in curve]
    print("mean reward per step:", rewards)
    assert len(rewards) == 10
    assert max(rewards[:2]) < 0.2, rewards
    assert sum(rewards[-3:]) / 3 > 0.5, rewards


def test_reward_rises_scored_in_a_sandbox_and_in_process(served: tuple[str, str], tmp_path: Path) -> None:
    """The same seed gives the same curve whichever side scores: the sandbox's reward is the
    in-process one."""
    url, key = served
    png = tmp_path / "curve.png"
    here = _run(url, key, tmp_path, "--in-process", "--plot", str(png))
    _rises(here)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if shutil.which("bwrap") is None:
        pytest.skip("the sandbox needs bubblewrap (the in-process loop passed)")
    in_sandbox = _run(url, key, tmp_path)
    assert [_shape(row) for row in in_sandbox] == [_shape(row) for row in here]


def _shape(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["step"], row["mean_reward"], row["groups_skipped"], row["data"]


def test_help_names_the_reward_contract(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_script().main(["--help"])
    assert "reward(prompt, completion, params)" in capsys.readouterr().out


def test_a_malformed_forward_backward_body_is_422_over_http(served: tuple[str, str]) -> None:
    """What the SDK would get for a body the gym's codec cannot read (tests/unit/services/training/
    test_tinker_protowire.py covers the codec): the gym's standard 422, before anything is queued."""
    url, key = served
    r = httpx.post(f"{url}/tinker/api/v1/forward_backward", content=b"\x0a\x05ab",
                   headers={"X-API-Key": "tml-" + key, "Content-Type": "application/x-protobuf"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and "truncated field" in r.json()["error"]["message"]
