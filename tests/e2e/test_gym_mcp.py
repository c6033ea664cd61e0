"""`gym mcp` driven by the `mcp` SDK's own client over stdio, as Claude Code or Codex would start
it: a run key in the environment, the Experiment OS as tools, each call the HTTP API's own —
its effect visible over HTTP, its refusal the same error, recorded the same way."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, TextContent

from services.records.events import CALL_REFUSED
from tests.conftest import admin_headers, bearer, create_key
from tests.fakes.servers import serve_gym

GYM_CLI = str(Path(sys.executable).with_name("gym"))


@pytest.fixture
def served(gym: Any) -> Iterator[tuple[str, httpx.Client]]:
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield url, client


@asynccontextmanager
async def mcp_session(url: str, key: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=GYM_CLI, args=["mcp"], env={"RSIGYM_URL": url, "RSIGYM_API_KEY": key})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def run_with_session(url: str, key: str, scenario: Callable[[ClientSession], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with mcp_session(url, key) as session:
            return await asyncio.wait_for(scenario(session), timeout=60)

    return asyncio.run(main())


def text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], TextContent)
    return result.content[0].text


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    assert json.loads(text_of(result)) == result.structured_content  # the same JSON as text, for text-only clients
    return result.structured_content


def test_the_agent_works_through_the_four_groups(served: tuple[str, httpx.Client], tmp_path: Path) -> None:
    url, client = served
    key = create_key(client, budget_usd=1.0, track="joint")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i} + 1 =", "completion": str(i + 1)}) + "\n" for i in range(3)))

    async def scenario(session: ClientSession) -> dict[str, Any]:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        seen: dict[str, Any] = {"groups": {name.split("_", 1)[0] for name in tools}}
        create = tools["evidence_create_experiment"]
        seen["create_schema"] = (set(create.input_schema["properties"]), create.input_schema.get("required"))
        seen["upload"] = ok(await session.call_tool("data_upload_dataset", {"path": str(rows), "name": "probe"}))
        seen["datasets"] = ok(await session.call_tool("data_list_datasets"))
        seen["head"] = ok(await session.call_tool("data_inspect_dataset",
                                                  {"dataset_id": seen["upload"]["id"], "rows": 2}))
        seen["experiment"] = ok(await session.call_tool(
            "evidence_create_experiment", {"name": "mcp probe", "note": "does the door work"}))
        seen["chat"] = ok(await session.call_tool(
            "execution_chat", {"model": "teacher", "prompt": "What is 40 + 2?", "service": "rollout",
                               "max_tokens": 8}))
        seen["balance"] = ok(await session.call_tool("evidence_balance"))
        seen["review"] = ok(await session.call_tool(
            "review_record_review", {"experiment_ids": [seen["experiment"]["id"]],
                                     "findings_supported": ["the teacher adds"]}))
        seen["missing"] = await session.call_tool("evidence_get_experiment", {"experiment_id": "exp_nope"})
        return seen

    seen = run_with_session(url, key["key"], scenario)
    assert seen["groups"] == {"data", "execution", "evidence", "review"}
    assert seen["create_schema"] == ({"name", "note", "parents"}, ["name"])

    # data: the upload is the run's dataset over HTTP too, and reads back
    http_datasets = client.get("/training/v1/datasets", headers=bearer(key["key"])).json()["data"]
    assert [d["id"] for d in seen["datasets"]["data"]] == [d["id"] for d in http_datasets] == [seen["upload"]["id"]]
    assert seen["upload"]["rows"] == 3 and seen["upload"]["name"] == "probe"
    assert seen["head"]["rows"] == 3 and seen["head"]["head"] == [{"prompt": "0 + 1 =", "completion": "1"},
                                                                  {"prompt": "1 + 1 =", "completion": "2"}]

    # execution: the reply, and what it cost, as the gateway charged it
    assert seen["chat"]["text"] == "42"
    cost = seen["chat"]["billing"]["cost_usd"]
    assert cost > 0

    # evidence: the experiment is in the run's records; the balance moved by the chat's cost
    experiment = client.get(f"/records/v1/experiments/{seen['experiment']['id']}", headers=bearer(key["key"])).json()
    assert experiment["name"] == "mcp probe" and experiment["owner_key_id"] == key["id"]
    http_balance = client.get("/v1/balance", headers=bearer(key["key"])).json()
    assert seen["balance"]["spent_usd"] == http_balance["spent_usd"] == pytest.approx(cost)
    assert seen["balance"]["remaining_usd"] == pytest.approx(1.0 - cost)

    # review: recorded on the experiment, attributed to the run's key
    reviews = client.get("/records/v1/annotations", params={"kind": "review"}, headers=bearer(key["key"])).json()
    assert [(r["id"], r["experiment_ids"], r["findings_supported"], r["key_id"]) for r in reviews["data"]] == [
        (seen["review"]["id"], [seen["experiment"]["id"]], ["the teacher adds"], key["id"])]

    # a gym error is an error result carrying the gateway's own error, not a crash or a success
    missing = seen["missing"]
    assert missing.is_error and missing.structured_content is not None
    http_missing = client.get("/records/v1/experiments/exp_nope", headers=bearer(key["key"]))
    assert missing.structured_content["error"]["status"] == http_missing.status_code == 404
    assert missing.structured_content["error"]["type"] == http_missing.json()["error"]["type"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_sandbox_round_trip_through_execution_tools(served: tuple[str, httpx.Client]) -> None:
    url, client = served
    key = create_key(client, budget_usd=1.0, track="joint")

    async def scenario(session: ClientSession) -> dict[str, Any]:
        created = ok(await session.call_tool("execution_sandbox_create", {"timeout_s": 60}))
        ran = ok(await session.call_tool("execution_sandbox_exec", {
            "sandbox_id": created["id"], "command": "echo $GREETING; echo oops >&2; exit 3",
            "env": {"GREETING": "hello"}}))
        killed = ok(await session.call_tool("execution_sandbox_kill", {"sandbox_id": created["id"]}))
        return {"created": created, "ran": ran, "killed": killed}

    seen = run_with_session(url, key["key"], scenario)
    assert seen["created"]["state"] == "running"
    assert (seen["ran"]["stdout"], seen["ran"]["stderr"], seen["ran"]["exit_code"]) == ("hello\n", "oops\n", 3)
    assert seen["killed"]["killed"] is True and seen["killed"]["state"] == "killed"
    record = client.get(f"/sandbox/v1/sandboxes/{seen['created']['id']}", headers=bearer(key["key"])).json()
    assert record["state"] == "killed"


def test_a_refused_call_is_the_http_refusal(served: tuple[str, httpx.Client]) -> None:
    """Training on a harness-track key: the tool's error is the HTTP API's, and both are recorded alike."""
    url, client = served
    key = create_key(client, budget_usd=1.0, track="harness")
    job = {"datasets": ["ds_none"], "base_model": "tiny", "steps": 1}

    async def scenario(session: ClientSession) -> CallToolResult:
        return await session.call_tool("execution_start_training", job)

    result = run_with_session(url, key["key"], scenario)
    http = client.post("/training/v1/jobs", json=job, headers=bearer(key["key"]))
    assert http.status_code == 403
    assert result.is_error and result.structured_content is not None
    error = result.structured_content["error"]
    assert (error["status"], error["type"], error["message"]) == (
        403, http.json()["error"]["type"], http.json()["error"]["message"])
    assert json.loads(text_of(result)) == result.structured_content  # what a text-only client reads

    events = client.get(f"/admin/v1/runs/{key['id']}/events", headers=admin_headers()).json()["data"]
    refused = [{k: v for k, v in e["data"].items() if k != "request_id"} for e in events if e["kind"] == CALL_REFUSED]
    assert len(refused) == 2 and refused[0] == refused[1]
    assert (refused[0]["service"], refused[0]["status"], refused[0]["error"]) == ("training", 403, error["type"])


def test_the_server_will_not_start_without_the_gym_in_its_environment() -> None:
    env = {"PATH": "/usr/bin:/bin", "RSIGYM_API_KEY": "rsk-anything"}  # no RSIGYM_URL
    done = subprocess.run([GYM_CLI, "mcp"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and done.stdout == ""
    assert "RSIGYM_URL" in done.stderr and "must be set" in done.stderr
