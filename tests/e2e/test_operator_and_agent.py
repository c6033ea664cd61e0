"""An operator and an agent drive a running gym the way their scripts would: the `rsigym`
CLI (section 7 names), the SDK and the `gym` CLI, over real HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

import rsigym
from ops.cli.main import app as operator_cli
from rsigym.cli import main as agent_cli
from tests.conftest import ADMIN_TOKEN
from tests.fakes.servers import serve_gym


@pytest.fixture
def running(gym: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield url


def rsigym_cmd(*args: str) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result.stdout


def test_operator_cli_manages_keys_with_the_documented_names(running: str) -> None:
    created = rsigym_cmd("keys", "create", "--track", "joint", "--budget", "2.5", "--json")
    assert set(created) == {"id", "key", "track", "budget_usd"}
    assert created["track"] == "joint" and created["budget_usd"] == 2.5 and created["key"].startswith("rsk-")
    kid = created["id"]
    assert rsigym_cmd("keys", "topup", kid, "0.5", "--json")["budget_usd"] == 3.0
    assert rsigym_cmd("keys", "pause", kid, "--json")["status"] == "paused"
    assert rsigym_cmd("keys", "resume", kid, "--json")["status"] == "active"
    assert [k["id"] for k in rsigym_cmd("keys", "list", "--json")["data"]] == [kid]
    assert rsigym_cmd("keys", "show", kid, "--json")["remaining_usd"] == 3.0
    assert rsigym_cmd("ledger", kid, "--json") == {"data": []}
    assert "revoked" in rsigym_cmd("keys", "revoke", kid)
    bad = CliRunner().invoke(operator_cli, ["keys", "create", "--track", "nope", "--budget", "1"])
    assert bad.exit_code == 1 and "invalid_request_error" in bad.output


def test_agent_sdk_and_cli_against_the_gym(running: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    created = rsigym_cmd("keys", "create", "--track", "joint", "--budget", "1", "--json")
    monkeypatch.setenv("RSIGYM_API_KEY", created["key"])
    with rsigym.Gym() as gym:
        assert gym.balance().remaining_usd == 1.0
        reply = gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "What is 40 + 2?"}], max_tokens=8)
        assert reply.choices[0].message.content == "42"
        assert reply.cost_usd and reply.cost_usd > 0 and reply.request_id.startswith("req_")
        with gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "go"}], max_tokens=6,
                              stream=True, stream_options={"include_usage": True}) as stream:
            chunks = list(stream)
        assert stream.usage is not None and stream.usage.completion_tokens == 6
        child = gym.keys.mint(name="worker", budget_usd=0.0)
        with pytest.raises(rsigym.BudgetExhaustedError) as info:
            rsigym.Gym(api_key=child.key).rollout.chat(model="teacher", messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 402 and info.value.request_id
        assert [k.id for k in gym.keys.list()] == [child.id]
        ledger = rsigym_cmd("ledger", created["id"], "--json")["data"]
        assert len(ledger) == 2 and sum(r["actual_usd"] for r in ledger) == pytest.approx(gym.balance().spent_usd)
    assert chunks

    async def async_balance() -> float:
        async with rsigym.AsyncGym() as agym:
            return (await agym.balance()).spent_usd

    assert asyncio.run(async_balance()) > 0
    assert agent_cli(["balance", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget_usd"] == 1.0
    assert agent_cli(["rollout", "chat", "--model", "teacher", "What is 5 - 3?"]) == 0
    assert capsys.readouterr().out.strip() == "2"
    monkeypatch.setenv("RSIGYM_API_KEY", "rsk-not-a-key")
    assert agent_cli(["balance"]) == 1
    assert "authentication_error" in capsys.readouterr().err
