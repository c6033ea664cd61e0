"""The launcher's entries for coding-agent CLIs: their registry fields, the configuration written
into the agent's HOME (the agent route, the MCP server, no key in any file), and a run of an agent
whose pinned CLI is not installed refused before any key is minted."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kit.config import GymConfig, load_config
from kit.errors import Unprocessable
from ops import agent_setup, agent_toolbox, launcher
from ops.tasks import TASKS, find_task

GATEWAY = "http://127.0.0.1:8700"


def test_codex_config_names_the_agent_route_and_the_mcp_server_and_no_key(tmp_path: Path) -> None:
    written = agent_setup.write("codex", tmp_path, uid=None, gateway_url=GATEWAY, agent_model="agent-llm",
                                gym="/opt/tools/python/bin/gym")
    assert written == [tmp_path / ".codex" / "config.toml"]
    config = tomllib.loads(written[0].read_text())
    assert config["model"] == "agent-llm" and config["model_provider"] == "rsigym"
    provider = config["model_providers"]["rsigym"]
    assert provider["base_url"] == f"{GATEWAY}/agent/v1" and provider["wire_api"] == "responses"
    assert provider["env_key"] == "RSIGYM_API_KEY"  # read from the environment, never written down
    assert config["mcp_servers"]["gym"] == {"command": "/opt/tools/python/bin/gym", "args": ["mcp"],
                                            "env_vars": ["RSIGYM_URL", "RSIGYM_API_KEY"]}
    assert config["web_search"] == "disabled" and config["sandbox_mode"] == "danger-full-access"
    assert written[0].stat().st_mode & 0o777 == 0o600


def test_claude_code_mcp_config_is_the_file_its_command_names(tmp_path: Path) -> None:
    agent_setup.write("claude-code", tmp_path, uid=None, gateway_url=GATEWAY, agent_model="agent-llm", gym="/t/gym")
    template = launcher.load_agents()["claude-code"]
    named = template.command[template.command.index("--mcp-config") + 1]
    assert named == f"/home/agent/{agent_setup.CLAUDE_MCP_CONFIG}"
    servers = json.loads((tmp_path / agent_setup.CLAUDE_MCP_CONFIG).read_text())["mcpServers"]
    assert servers == {"gym": {"type": "stdio", "command": "/t/gym", "args": ["mcp"]}}


@pytest.mark.parametrize("raw, message", [
    ({"command": ["x"], "npm": ["@openai/codex"]}, "pinned"),
    ({"command": ["x"], "setup": "aider"}, "setup 'aider'"),
])
def test_a_registry_entry_must_pin_its_packages_and_name_a_known_setup(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        launcher.AgentTemplate.model_validate(raw)


class _Minter:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def create_key(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(body)
        return {"id": "k", "key": "secret"}

    def set_deadline(self, key_id: str, deadline_s: float) -> dict[str, Any]:
        return {}


def _start(tmp_path: Path, config: GymConfig, minter: _Minter) -> None:
    task = find_task("joint-arithmetic", TASKS)
    launcher.start_run(data_dir=tmp_path, gateway_url=GATEWAY, client=minter, task=task, key_body={},
                       instruction="x", agent="codex", config=config)


def test_a_cli_not_in_the_toolbox_is_refused_with_the_install_command_and_no_key_minted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(agent_toolbox.DIR_ENV, str(tmp_path / "empty"))
    config = GymConfig.model_validate({"agent_models": [{"name": "agent-llm", "litellm_model": "openai/agent-llm",
                                                         "served_by": "standin", "input_usd_per_mtok": 1,
                                                         "output_usd_per_mtok": 1}]})
    minter = _Minter()
    with pytest.raises(Unprocessable, match="rsigym agents install codex"):
        _start(tmp_path, config, minter)
    with pytest.raises(Unprocessable, match="no agent_models"):
        _start(tmp_path, GymConfig(), minter)
    assert minter.calls == []


def test_the_dag_agent_on_a_gym_without_an_agent_model_is_refused_before_any_key_is_minted(tmp_path: Path) -> None:
    """It thinks on the agent route: on a gym with no ``agent_models`` it used to start, index an
    empty model list (IndexError) and leave its run key active; now the launcher refuses it first."""
    minter = _Minter()
    task = find_task("joint-arithmetic", TASKS)
    with pytest.raises(Unprocessable, match="'dag' needs an agent model"):
        launcher.start_run(data_dir=tmp_path, gateway_url=GATEWAY, client=minter, task=task, key_body={},
                           instruction="x", agent="dag", config=GymConfig())
    assert minter.calls == [] and not launcher.runs_root(tmp_path).exists()


def test_the_offline_default_config_gives_the_dag_agent_its_model() -> None:
    """A plain `rsigym up` (kit/offline_gym.toml) has a stand-in agent model, passed to the agent."""
    config = load_config(None)
    assert [m.served_by for m in config.agent_models] == ["standin"]
    template = launcher.load_agents()["dag"]
    filled = launcher._fill(template.command, launcher._placeholders(template, "dag", config))
    assert filled[filled.index("--model") + 1] == config.agent_models[0].name
