"""The chat template shared by the tiny model, training and inference.

Qwen-style markup: ``<|im_start|>role\\ncontent<|im_end|>\\n``; tools are listed in a system
turn and a tool call is ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``. Training and
serving render messages with the same function, so a model is always asked in the shape it
was trained on.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
SPECIAL_TOKENS = [EOT, IM_START, IM_END, TOOL_OPEN, TOOL_CLOSE]

def _content(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    # Non-ASCII as itself, not as \u escapes: the text trained and audited is what the call says.
    return TOOL_OPEN + json.dumps({"name": fn.get("name"), "arguments": args}, separators=(",", ":"),
                                  ensure_ascii=False) + TOOL_CLOSE


def render_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """Everything before the assistant's answer, ending with the assistant header."""
    parts = []
    if tools:
        names = ", ".join(t["function"]["name"] for t in tools)
        parts.append(f"{IM_START}system\nTools: {names}{IM_END}\n")
    for m in messages:
        calls = "".join(_call_text(c) for c in m.get("tool_calls") or [])
        parts.append(f"{IM_START}{m['role']}\n{_content(m)}{calls}{IM_END}\n")
    parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def render_answer(message: dict[str, Any]) -> str:
    """The assistant turn the model should produce, with its end marker."""
    calls = "".join(_call_text(c) for c in message.get("tool_calls") or [])
    return f"{_content(message)}{calls}{IM_END}"


def split_example(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    """(prompt, answer) for training: the answer is the last assistant turn."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("the last message must be the assistant's answer")
    return render_prompt(messages[:-1], tools), render_answer(messages[-1])


_CALL = re.compile(re.escape(TOOL_OPEN) + r"(.*?)" + re.escape(TOOL_CLOSE), re.S)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split generated text into plain content and OpenAI-shaped tool calls."""
    calls = []
    for match in _CALL.finditer(text):
        try:
            data = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            continue
        args = data.get("arguments", {})
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:16]}",
            "type": "function",
            "function": {"name": data["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
        })
    content = _CALL.sub("", text).strip() if calls else text
    return content, calls
