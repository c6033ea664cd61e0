"""``rsigym run start`` in embedded mode: the scripted agent, in its namespaces, sees only its
environment and reaches only the gateway (not the store, not another loopback port, not the data dir)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli.main import app as operator_cli
from tests.conftest import ADMIN_TOKEN
from tests.fakes.servers import serve_gym

EXPECTED_ENV = sorted(["RSIGYM_URL", "RSIGYM_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL",
                       "ANTHROPIC_API_KEY", "PATH", "HOME", "RSIGYM_INSTRUCTION"])


@pytest.fixture
def live(make_gym: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    if shutil.which("bwrap") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("bubblewrap (bwrap) is missing on a CI host")
        pytest.skip("bubblewrap (bwrap) is not installed")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    gym = make_gym()
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        monkeypatch.setenv("RSIGYM_DATA_DIR", str(data_dir))
        yield url, data_dir


def rsigym(*args: str) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result.stdout


def report(log: str) -> dict[str, Any]:
    out = {}
    for line in log.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name.isidentifier():
            try:
                out[name] = json.loads(value)
            except ValueError:
                pass
    return out


def test_scripted_agent_reaches_only_the_gateway(live: tuple[str, Path]) -> None:
    url, data_dir = live
    gateway_port = int(url.rsplit(":", 1)[1])
    with socket.socket() as other:  # a loopback service on the host the agent must not reach
        other.bind(("127.0.0.1", 0))
        other.listen()
        other_port = other.getsockname()[1]
        started = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "scripted", "--json", "--",
                         "--probe-port", str(gateway_port), "--probe-port", str(other_port),
                         "--probe-path", str(data_dir), "--probe-path", str(Path.cwd()))
        run = started["run"]
        for _ in range(300):
            shown = rsigym("run", "show", run, "--json")
            if shown["status"] != "running":
                break
            time.sleep(0.1)
    log = rsigym("run", "logs", run)
    assert shown["status"] == "exited" and shown["exit_code"] == 0, log
    seen = report(log)
    assert seen["env"] == EXPECTED_ENV
    assert seen["instruction_chars"] > 0
    status, balance = seen["balance"]
    assert status == 200 and balance["budget_usd"] > 0, balance
    assert seen["agent_models_status"] != 0  # the agent route answered through the relay
    reach = seen["reach"]
    assert all(v != "connected" for v in reach.values()), reach  # store, redis, host gateway port, other port
    assert set(reach) == {"5432", "6379", str(gateway_port), str(other_port)}
    assert seen["paths"] == {str(data_dir): False, str(Path.cwd()): False}
    assert [r["run"] for r in rsigym("run", "list", "--json")["data"]] == [run]
    # The key the run got is the one the gateway knows, and stop ends the run there.
    rsigym("run", "stop", run)
    assert rsigym("run", "show", run, "--json")["status"] == "exited"
