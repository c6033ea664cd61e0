"""The configuration files a coding-agent CLI reads from its HOME, written into a launched run's
fresh HOME before the agent starts (``setup`` in ops/agents.toml): the gym's agent route as its
model provider, the Experiment OS (``gym mcp``, sdk/rsigym/mcp) as its MCP server ``gym``, its own
sandbox and approvals off (the launcher's namespace is the sandbox) and update checks, telemetry
and other non-essential traffic off (nothing but the gateway is reachable anyway).

No file holds the run key: the CLIs and the MCP server read it from the environment
(``ANTHROPIC_API_KEY``, ``RSIGYM_API_KEY``), which only the agent's uid can read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

CLAUDE_MCP_CONFIG = ".rsigym/mcp.json"
"""Claude Code's ``--mcp-config`` file, relative to HOME (ops/agents.toml names it)."""


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string (both escape with \uXXXX)


def claude_code(home: Path, *, gateway_url: str, agent_model: str, gym: str) -> dict[str, str]:
    """Claude Code: the MCP server list (``--mcp-config``) and user settings without onboarding."""
    servers = {"mcpServers": {"gym": {"type": "stdio", "command": gym, "args": ["mcp"]}}}
    settings = {"model": agent_model, "includeCoAuthoredBy": False, "cleanupPeriodDays": 1}
    return {CLAUDE_MCP_CONFIG: json.dumps(servers, indent=2) + "\n",
            ".claude/settings.json": json.dumps(settings, indent=2) + "\n"}


def codex(home: Path, *, gateway_url: str, agent_model: str, gym: str) -> dict[str, str]:
    """Codex: the agent route as a Responses API provider keyed from ``RSIGYM_API_KEY``, the MCP
    server ``gym`` (given the two variables it needs: Codex hands MCP servers a minimal
    environment), no sandbox or approvals, no web search (Codex then sends no web_search tool,
    which the gym refuses), no update check, no analytics, feedback or telemetry export. Every key
    here was checked against Codex 0.171.0, which refuses a bad value for each."""
    lines = [
        f"model = {_toml_str(agent_model)}",
        'model_provider = "rsigym"',
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        'web_search = "disabled"',
        "check_for_update_on_startup = false",
        "",
        "[model_providers.rsigym]",
        'name = "RSIGym agent route"',
        f"base_url = {_toml_str(gateway_url.rstrip('/') + '/agent/v1')}",
        'env_key = "RSIGYM_API_KEY"',
        'wire_api = "responses"',
        "",
        "[mcp_servers.gym]",
        f"command = {_toml_str(gym)}",
        'args = ["mcp"]',
        'env_vars = ["RSIGYM_URL", "RSIGYM_API_KEY"]',
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[feedback]",
        "enabled = false",
        "",
        "[otel]",
        'exporter = "none"',
        'trace_exporter = "none"',
        'metrics_exporter = "none"',
        "log_user_prompt = false",
        "",
    ]
    return {".codex/config.toml": "\n".join(lines)}


WRITERS: dict[str, Callable[..., dict[str, str]]] = {"claude-code": claude_code, "codex": codex}


def write(kind: str, home: Path, *, uid: int | None, gateway_url: str, agent_model: str, gym: str,
          mode: int = 0o600) -> list[Path]:
    """Write ``kind``'s files into ``home`` (owned by the agent's ``uid``: the CLIs write beside
    them); the paths written. ``mode`` 0o644: for a container's user to copy (compose mode)."""
    files = WRITERS[kind](home, gateway_url=gateway_url, agent_model=agent_model, gym=gym)
    written = []
    for rel, text in files.items():
        path = home / rel
        for parent in reversed(path.relative_to(home).parents[:-1]):
            directory = home / parent
            directory.mkdir(mode=0o700 if mode == 0o600 else 0o755, exist_ok=True)
            if uid is not None:
                os.chown(directory, uid, uid)
        path.write_text(text)
        path.chmod(mode)
        if uid is not None:
            os.chown(path, uid, uid)
        written.append(path)
    return written
