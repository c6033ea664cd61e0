"""The MCP tools over a fake gateway, in-process: what each sends, the JSON it returns, and a gym
error as an ``isError`` result — plus what ``rsigym.mcp`` may import (it runs from a venv with
the SDK and ``mcp`` only)."""

from __future__ import annotations

import ast
import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
from mcp import Client
from mcp.types import CallToolResult

from rsigym.mcp import build_server

MCP_DIR = Path(__file__).resolve().parents[3] / "sdk" / "rsigym" / "mcp"


def call(gateway: Any, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
    async def go() -> CallToolResult:
        async with Client(build_server(gateway.gym(max_retries=0))) as client:
            return await client.call_tool(name, arguments or {})

    return asyncio.run(go())


def test_the_package_imports_only_the_sdk_mcp_and_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"mcp", "pydantic", "httpx"}
    offenders: set[str] = set()
    sources = sorted(MCP_DIR.glob("*.py"))
    assert {p.stem for p in sources} >= {"server", "data", "execution", "evidence", "review"}
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            offenders |= {f"{path.name}: {n}" for n in names if n.split(".")[0] not in allowed}
    assert offenders == set()


def test_a_list_is_the_http_list_shape_with_what_the_call_cost(gateway: Any) -> None:
    dataset = {"id": "ds_1", "object": "dataset", "name": "n", "sha256": "ab", "format": "jsonl", "rows": 2, "bytes": 9}
    gateway.route("GET", "/training/v1/datasets",
                  gateway.ok({"object": "list", "data": [dataset]}, request_id="req_l", cost="0", remaining="4.5"))
    result = call(gateway, "data_list_datasets")
    assert not result.is_error
    assert result.structured_content == {"object": "list", "data": [{**dataset, "created_at": None}],
                                         "billing": {"cost_usd": 0.0, "remaining_usd": 4.5, "request_id": "req_l"}}


def test_a_gym_error_is_an_error_result_with_its_type_status_and_message(gateway: Any) -> None:
    gateway.route("POST", "/records/v1/experiments",
                  gateway.error(422, "invalid_request_error", "parent exp_x is not readable", param="parents",
                                request_id="req_bad"))
    result = call(gateway, "evidence_create_experiment", {"name": "x", "parents": ["exp_x"]})
    assert result.is_error
    assert result.structured_content == {"error": {
        "type": "invalid_request_error", "message": "parent exp_x is not readable", "param": "parents",
        "status": 422, "request_id": "req_bad"}}
    assert gateway.json_sent() == {"name": "x", "parents": ["exp_x"]}


def test_no_answer_and_a_bad_id_are_error_results_too(gateway: Any) -> None:
    gateway.route("GET", "/v1/balance", httpx.ConnectError("refused"))
    down = call(gateway, "evidence_balance")
    assert down.is_error and down.structured_content is not None
    assert (down.structured_content["error"]["type"], down.structured_content["error"]["status"]) == (
        "connection_error", None)
    empty = call(gateway, "execution_training_status", {"job_id": ""})
    assert empty.is_error and empty.structured_content is not None
    assert empty.structured_content["error"]["type"] == "invalid_request_error"
    assert gateway.calls("GET", "/training/v1/jobs/") == []  # refused before any request


def test_start_training_sends_the_named_fields_over_options(gateway: Any) -> None:
    job = {"id": "tj_1", "status": "queued", "base_model": "tiny"}
    gateway.route("POST", "/training/v1/jobs", gateway.ok(job, status=201))
    result = call(gateway, "execution_start_training", {
        "datasets": ["ds_1"], "base_model": "tiny", "steps": 3,
        "options": {"seed": 7, "steps": 99, "schedule": "cosine"}})
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["id"] == "tj_1"
    assert gateway.json_sent() == {"datasets": ["ds_1"], "base_model": "tiny", "steps": 3, "seed": 7,
                                   "schedule": "cosine"}


def test_a_chat_sends_system_and_prompt_and_returns_the_text(gateway: Any) -> None:
    reply = {"model": "ckpt_1", "choices": [{"message": {"role": "assistant", "content": "5"}}]}
    gateway.route("POST", "/inference/v1/chat/completions", gateway.ok(reply, cost="0.0002", remaining="1.5"))
    result = call(gateway, "execution_chat", {"model": "ckpt_1", "prompt": "2+3?", "system": "digits only"})
    assert result.structured_content is not None
    assert result.structured_content["text"] == "5"
    assert result.structured_content["billing"]["cost_usd"] == 0.0002
    assert gateway.json_sent() == {"model": "ckpt_1", "messages": [
        {"role": "system", "content": "digits only"}, {"role": "user", "content": "2+3?"}]}
