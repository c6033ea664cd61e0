"""Claude Code and Codex — the pinned, unmodified CLIs from the npm registry, run from the agents'
toolbox (``rsigym agents install``) — launched by ``rsigym run start`` in their namespace, offline:
the stand-in plays their model with a scripted trajectory (a shell call, then an Experiment OS call
through ``gym mcp``, then the answer), so each CLI runs its real tool loop through the gym. Each
answers through the agent route, its turns are on the agent meter and in the trajectory the audit
reads, its MCP call lands in the run's records, and its shell ran as the namespace's unprivileged
uid, unable to touch the host."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit.config import GymConfig
from ops import agent_toolbox
from ops.launcher import load_agents
from tests.conftest import ADMIN_TOKEN, IN_CI, admin_headers, bearer, gym_config, require_bwrap
from tests.e2e.test_launcher import rsigym, shown_key, wait_for_exit
from tests.fakes.servers import serve_gym

MARK = "rsigym-cli-probe"
SHELL = (f"id -u > $HOME/{MARK}.uid; touch /etc/{MARK} 2>/dev/null; echo ran-{MARK}; "
         "ls /root /work 2>&1 | head -3")
"""The scripted shell call: records its uid, tries to write the host's /etc (it must fail)."""
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "claude-code": [
        {"tool": "Bash", "arguments": {"command": SHELL, "description": "probe the sandbox"}},
        {"tool": "evidence_create_experiment", "arguments": {"name": "claude-code-probe", "note": "from MCP"}},
        {"say": f"claude-code {MARK}: done"},
    ],
    "codex": [
        {"tool": ["exec_command", "shell"], "arguments": {"cmd": SHELL}},
        {"tool": "evidence_create_experiment", "arguments": {"name": "codex-probe", "note": "from MCP"}},
        {"say": f"codex {MARK}: done"},
    ],
}
SHELL_TOOL = {"claude-code": "Bash", "codex": "exec_command"}
API = {"claude-code": "anthropic", "codex": "responses"}


def _require_toolbox(agent: str) -> None:
    absent = agent_toolbox.missing(load_agents()[agent].npm)
    if absent or agent_toolbox.stale():
        what = f"{', '.join(absent)} not in the agents' toolbox" if absent else "the agents' toolbox has another SDK"
        message = f"{what}: `rsigym agents install claude-code codex` (make install does)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def _agent_models(agent: str) -> dict[str, Any]:
    return {"agent_models": [{"name": "agent-llm", "litellm_model": "openai/agent-llm", "served_by": "standin",
                              "script": SCRIPTS[agent], "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0,
                              "max_output_tokens": 64000}]}


def _config(agent: str) -> GymConfig:
    config = gym_config("http://127.0.0.1:9/v1")  # rollout's catalogue is not used here
    return config.model_copy(update={"agent_models": GymConfig.model_validate(_agent_models(agent)).agent_models})


def _inline(value: Any) -> str:
    """A TOML inline value (JSON's strings and arrays are TOML's; objects become inline tables)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_inline(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def _config_toml(agent: str) -> str:
    model = _agent_models(agent)["agent_models"][0]
    lines = ["[[agent_models]]", *(f"{k} = {json.dumps(v)}" for k, v in model.items() if k != "script")]
    for step in model["script"]:
        lines += ["[[agent_models.script]]", *(f"{k} = {_inline(v)}" for k, v in step.items())]
    return "\n".join(lines) + "\n"


@pytest.fixture
def launched(make_gym: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             request: pytest.FixtureRequest) -> Iterator[tuple[str, Path, str]]:
    agent = request.param
    require_bwrap()
    _require_toolbox(agent)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    gym = make_gym(config=_config(agent))
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        monkeypatch.setenv("RSIGYM_DATA_DIR", str(data_dir))
        # The operator's config file, as `rsigym run start` reads it (the launcher picks its agent model).
        toml = tmp_path / "gym.toml"
        toml.write_text(_config_toml(agent))
        monkeypatch.setenv("RSIGYM_CONFIG", str(toml))
        yield url, data_dir, agent


@pytest.mark.slow
@pytest.mark.parametrize("launched", ["claude-code", "codex"], indirect=True)
def test_the_unmodified_cli_runs_its_tool_loop_through_the_gym_inside_its_namespace(
        launched: tuple[str, Path, str]) -> None:
    url, data_dir, agent = launched
    assert not os.path.exists(f"/etc/{MARK}")
    started = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", agent, "--json")
    run = started["run"]
    shown = wait_for_exit(run, tries=1800)
    log = rsigym("run", "logs", run)
    assert shown["status"] == "exited" and shown["exit_code"] == 0, log
    assert f"{agent} {MARK}: done" in log  # the CLI printed the model's final answer

    # Its shell ran in the namespace as the pool's unprivileged uid, and the host's /etc is untouched.
    home = data_dir / "runs" / run / "home"
    uid = int((home / f"{MARK}.uid").read_text())
    assert uid != 0 and uid != os.getuid()
    assert not os.path.exists(f"/etc/{MARK}")
    # Its configuration holds no key (the key is in its environment only).
    key = shown_key(data_dir, run)
    for path in home.rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert key not in path.read_text(errors="replace"), path

    with httpx.Client(base_url=url, timeout=30) as client:
        # The Experiment OS call went through `gym mcp` with the run key: the experiment is the run's
        # (read as the operator: the run ended with its agent, so its key is closed).
        assert client.get("/records/v1/experiments", headers=bearer(key)).status_code == 403
        experiments = client.get(f"/admin/v1/runs/{run}/experiments", headers=admin_headers()).json()["data"]
        assert [e["name"] for e in experiments] == [f"{agent}-probe"]
        # Every turn is in the trajectory the audit reads, on the agent route's API the CLI speaks.
        turns = client.get(f"/admin/v1/runs/{run}/trajectory", headers=admin_headers()).json()["data"]
    assert len(turns) >= 3 and {t["api"] for t in turns} == {API[agent]}, turns
    called = [c["name"] for t in turns for c in (t["response"].get("tool_calls") or [])]
    assert SHELL_TOOL[agent] in called and any(n.endswith("evidence_create_experiment") for n in called), called
    shell_output = json.dumps([t["request"] for t in turns])
    assert f"ran-{MARK}" in shell_output  # the tool result went back to the model through the gym
    # On the agent meter, settled, nothing left reserved; the service budget paid only for the records call.
    watched = rsigym("watch", run, "--json")
    assert watched["agent_model"]["spent_usd"] > 0 and watched["agent_model"]["reserved_usd"] == 0, watched
    assert watched["run"]["reserved_usd"] == 0
