"""The Responses API as the chat the rollout code serves (services/rollout/responses.py): what a
request becomes, what is refused before any money is held, and a chat answer or stream as the
Responses answer a client reads."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kit.errors import PermissionDenied, Unprocessable
from kit.identity import COST_TRAILER_PREFIX
from services.rollout.responses import ResponsesStream, to_chat_body, to_response
from services.rollout.schemas import parse_chat_request

CODEX = json.loads((Path(__file__).parents[3] / "fixtures/clients/codex_0.171.0_responses.json").read_text())["body"]
CALC = {"type": "function", "name": "calc", "description": "Arithmetic.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}, "strict": False}


def _codex() -> dict[str, Any]:
    body = copy.deepcopy(CODEX)
    body["tools"] = [t for t in body["tools"] if t["type"] != "web_search"]
    return body


def test_codex_request_becomes_a_chat_the_rollout_code_accepts() -> None:
    chat = to_chat_body(_codex())
    parse_chat_request(chat)  # every field is one chat takes
    assert [m["role"] for m in chat["messages"]] == ["developer", "developer", "user", "user"]
    assert chat["messages"][-1]["content"] == [{"type": "text", "text": "What is 2+3?"}]
    names = [t["function"]["name"] for t in chat["tools"]]
    assert "exec_command" in names and "multi_agent_v1__spawn_agent" in names  # namespace tools flattened
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is True
    for dropped in ("reasoning", "store", "include", "prompt_cache_key", "client_metadata", "stream", "metadata"):
        assert dropped not in chat


def test_fields_map_to_their_chat_equivalents() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    chat = to_chat_body({"model": "m", "instructions": "Be brief.", "input": "2+3?", "max_output_tokens": 32,
                         "temperature": 0.5, "top_p": 0.9, "user": "u1", "store": False,
                         "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
                         "reasoning": {"effort": "high"}, "truncation": "auto", "service_tier": "auto"})
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"], chat["user"]) == (32, 0.5, 0.9, "u1")
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    assert "reasoning_effort" not in chat and "service_tier" not in chat


def test_a_tool_loop_becomes_tool_calls_and_tool_messages_without_reasoning() -> None:
    chat = to_chat_body({"model": "m", "tools": [CALC], "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "2+3?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"type": "function_call", "call_id": "call_1", "name": "calc", "arguments": "{\"q\":\"2+3\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 5."}]}]})
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call = chat["messages"][1]["tool_calls"][0]
    assert (call["id"], call["function"]["name"], call["function"]["arguments"]) == ("call_1", "calc", "{\"q\":\"2+3\"}")
    assert chat["messages"][2] == {"role": "tool", "content": "5", "tool_call_id": "call_1"}
    assert "opaque" not in json.dumps(chat)


@pytest.mark.parametrize("tool", [
    {"type": "web_search"}, {"type": "web_search", "external_web_access": False},
    {"type": "web_search_preview"}, {"type": "file_search", "vector_store_ids": ["vs"]},
    {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "computer_use_preview"},
    {"type": "image_generation"}, {"type": "mcp", "server_label": "x", "server_url": "https://x.example"},
    {"type": "local_shell"},
    {"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]},
])
def test_server_tools_are_refused(tool: dict[str, Any]) -> None:
    with pytest.raises(PermissionDenied, match="refused"):
        to_chat_body({"model": "m", "input": "hi", "tools": [CALC, tool]})


def test_storage_and_state_are_refused() -> None:
    with pytest.raises(PermissionDenied, match="store"):
        to_chat_body({"model": "m", "input": "hi", "store": True})
    for field, value in (("previous_response_id", "resp_1"), ("conversation", "conv_1"), ("background", True),
                         ("prompt", {"id": "pmpt_1"})):
        with pytest.raises(Unprocessable, match="provider-side state") as err:
            to_chat_body({"model": "m", "input": "hi", field: value})
        assert err.value.param == field
    with pytest.raises(Unprocessable, match="item_reference"):
        to_chat_body({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]})
    with pytest.raises(Unprocessable, match="unsupported field 'frobnicate'"):
        to_chat_body({"model": "m", "input": "hi", "frobnicate": 1})
    assert to_chat_body({"model": "m", "input": "hi", "background": False, "previous_response_id": None})


def test_a_chat_answer_becomes_a_response_with_namespace_calls_and_cost() -> None:
    completion = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "agent-model",
                  "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                      "role": "assistant", "content": "Spawning.", "tool_calls": [{
                          "id": "call_1", "type": "function",
                          "function": {"name": "multi_agent_v1__spawn_agent", "arguments": "{}"}}]}}],
                  "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "cost_usd": 1.8e-5}}
    response = to_response(completion, _codex())
    assert response["object"] == "response" and response["status"] == "completed"
    message, call = response["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "Spawning."
    assert (call["type"], call["namespace"], call["name"], call["call_id"]) == \
        ("function_call", "multi_agent_v1", "spawn_agent", "call_1")
    assert response["usage"]["input_tokens"] == 10 and response["usage"]["output_tokens"] == 4
    assert response["usage"]["total_tokens"] == 14 and response["usage"]["cost_usd"] == 1.8e-5


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return _sse({"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": choices, **extra})


async def _rollout(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


def _translate(pieces: list[bytes], body: dict[str, Any]) -> tuple[list[bytes], ResponsesStream]:
    stream = ResponsesStream(body, _rollout(pieces))

    async def run() -> list[bytes]:
        return [e async for e in stream.events()]

    return asyncio.run(run()), stream


def _parsed(out: list[bytes]) -> list[dict[str, Any]]:
    events = []
    for piece in out:
        if piece.startswith(b"event: "):
            name, data = piece.decode().split("\n")[:2]
            assert name == "event: " + json.loads(data[6:])["type"]
            events.append(json.loads(data[6:]))
    return events


TRAILER = COST_TRAILER_PREFIX + b"12345\n\n"


def test_a_stream_becomes_responses_events_with_the_trailer_before_completion() -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8, "cost_usd": 9e-6}
    out, stream = _translate([_chunk({"role": "assistant", "content": "5"}), _chunk({}, "stop"),
                              _chunk(None, usage=usage), TRAILER, b"data: [DONE]\n\n"],
                             {"model": "agent-llm", "input": "2+3?", "stream": True})
    events = _parsed(out)
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert out[-2] == TRAILER  # settled before the client reads the end
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["model"] == "agent-llm"
    assert done["usage"]["input_tokens"] == 7 and done["usage"]["cost_usd"] == 9e-6
    assert done["output"][0]["content"][0]["text"] == "5"
    assert stream.trailer == TRAILER and stream.error is None


def test_a_streamed_namespace_call() -> None:
    call = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "ns__calc", "arguments": ""}}
    pieces = [_chunk({"role": "assistant", "tool_calls": [call]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":1}"}}]}),
              _chunk({}, "tool_calls"), _chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 9}), TRAILER]
    events = _parsed(_translate(pieces, {"model": "m", "input": "x", "tools": [
        {"type": "namespace", "name": "ns", "description": "", "tools": [CALC]}]})[0])
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert (item["type"], item["namespace"], item["name"], item["arguments"]) == \
        ("function_call", "ns", "calc", "{\"q\":1}")


def test_a_stream_that_broke_off_ends_failed_and_still_settles() -> None:
    error = {"error": {"type": "upstream_error", "message": "the provider went away. Billed $0.01.", "param": None}}
    out, stream = _translate([_chunk({"role": "assistant", "content": "Fi"}), _sse(error), TRAILER,
                              b"data: [DONE]\n\n"], {"model": "m", "input": "x"})
    events = _parsed(out)
    assert events[-1]["type"] == "response.failed" and "response.completed" not in [e["type"] for e in events]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "upstream_error"
    assert "went away" in failed["error"]["message"]
    assert events[-1]["sequence_number"] == events[-2]["sequence_number"] + 1
    assert out[-1] == TRAILER and stream.error == error["error"]
