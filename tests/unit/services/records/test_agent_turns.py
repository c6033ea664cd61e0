"""A trajectory turn is bounded without losing what the audit's judge must read: a coding CLI's
request (tens of kB of tool schemas, a growing conversation) keeps its newest messages, and every
dialect — chat, Messages, Responses — renders its last message and the model's answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.records.agent_turns import MAX_FIELD_CHARS, bounded, render_text

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "clients"


def _turn(api: str, request: Any, text: str = "5") -> dict[str, Any]:
    return {"seq": 1, "api": api, "model": "agent-llm", "created_at": "t", "request": request,
            "response": {"text": text, "tool_calls": []}}


def test_a_long_cli_request_keeps_its_newest_message_and_tools_by_name() -> None:
    body = json.loads((FIXTURES / "claude_code_2.1.332_messages.json").read_text())["body"]
    history = [{"role": "user" if i % 2 else "assistant", "content": f"old turn {i} " + "x" * 2000}
               for i in range(40)]
    newest = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ran-probe uid 200000"}]}
    request = {**body, "messages": [*body["messages"], *history, newest]}
    stored, truncated = bounded(request)
    assert truncated and len(json.dumps(stored)) <= MAX_FIELD_CHARS
    assert stored["messages"][-1] == newest and stored["messages_dropped"] > 0
    assert "Bash" in stored["tools"] and all(isinstance(t, str) for t in stored["tools"])
    assert "ran-probe uid 200000" in render_text([_turn("anthropic", stored)])


def test_a_short_request_is_kept_whole() -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
    assert bounded(request) == (request, False)


def test_a_responses_turn_renders_its_input_and_a_tool_result() -> None:
    codex = json.loads((FIXTURES / "codex_0.171.0_responses.json").read_text())["body"]
    assert "[user] What is 2+3?" in render_text([_turn("responses", codex)])
    loop = {"model": "m", "instructions": "Be brief.", "input": [
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\": \"id -u\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "200000"}]}
    text = render_text([_turn("responses", loop, "done")])
    assert "[tool] 200000" in text and "[model] done" in text
    assert "[system] Be brief." in render_text([_turn("responses", {"model": "m", "instructions": "Be brief.",
                                                                    "input": "hi"})])


def test_what_a_tool_printed_reaches_the_judge_and_the_terminal_inert() -> None:
    attack = "ok\x1b]52;c;ZXZpbA==\x07\x1b[2J\r\u202eforged"  # clipboard write, clear screen, overwrite, bidi
    loop = {"model": "m", "input": [{"type": "function_call_output", "call_id": "c1", "output": attack}]}
    text = render_text([_turn("responses", loop, attack)])
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    assert "\\x1b]52;c;ZXZpbA==" in text  # what the agent tried stays visible to the judge
