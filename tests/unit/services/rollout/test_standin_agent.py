"""The stand-in plays an agent's model: it answers the last user question whatever a client CLI
wraps around it (system prompts, ~20 offered tools, ``<system-reminder>`` / ``<environment_context>``
blocks), calls a tool only when forced, and plays a configured script of tool calls — through the
unmodified ``openai`` SDK, plain and streaming, and through both in-process rollout backends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from typer.testing import CliRunner

from kit.config import RolloutConfig, RolloutModel
from kit.settings import ProviderSecrets
from services.rollout.anthropic import to_chat_body
from services.rollout.backends.litellm_backend import LiteLLMBackend
from services.rollout.backends.openai_compatible import OpenAICompatibleBackend
from services.rollout.schemas import parse_chat_request
from services.rollout.standin import JUDGE_MARKER, create_standin_app, load_scripts

FIXTURES = Path(__file__).parents[3] / "fixtures" / "clients"
CLAUDE = to_chat_body(json.loads((FIXTURES / "claude_code_2.1.332_messages.json").read_text())["body"])
KEY = "sk-standin-test"
BASH = {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}
CODEX_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
               for n in ("exec_command", "write_stdin", "mcp__gym__run_experiment")]


def _codex_messages() -> list[dict[str, Any]]:
    """Codex 0.171.0's captured input as chat messages (its input_text parts as text parts)."""
    body = json.loads((FIXTURES / "codex_0.171.0_responses.json").read_text())["body"]
    return [{"role": "system" if item["role"] == "developer" else item["role"],
             "content": [{"type": "text", "text": part["text"]} for part in item["content"]]}
            for item in body["input"] if item.get("type") == "message"]


def _client(**scripts: list[dict[str, Any]]) -> tuple[openai.OpenAI, Any]:
    app = create_standin_app(KEY, scripts=scripts)
    return openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, max_retries=0,
                         http_client=TestClient(app)), app


def _ask(oai: openai.OpenAI, model: str, messages: list[Any], stream: bool = False, **kw: Any) -> tuple[str, list[Any]]:
    """The answer's text and its tool calls (name, parsed arguments)."""
    if not stream:
        message = oai.chat.completions.create(model=model, messages=messages, max_tokens=256, **kw).choices[0].message
        return message.content or "", [(c.function.name, json.loads(c.function.arguments))
                                       for c in message.tool_calls or []]
    text, calls = "", []
    for chunk in oai.chat.completions.create(model=model, messages=messages, max_tokens=256, stream=True, **kw):
        delta = chunk.choices[0].delta if chunk.choices else None
        text += (delta.content or "") if delta else ""
        calls += [(c.function.name, json.loads(c.function.arguments)) for c in (delta.tool_calls or []) if delta]
    return text, calls


@pytest.mark.parametrize("stream", [False, True])
def test_it_answers_the_question_not_the_system_prompt_nor_the_offered_tools(stream: bool) -> None:
    oai, _ = _client()
    assert "2026-12-07" in json.dumps(CLAUDE["messages"]) and len(CLAUDE["tools"]) > 10  # numbers and tools to trip on
    assert _ask(oai, "standin", CLAUDE["messages"], stream, tools=CLAUDE["tools"]) == ("5", [])
    assert _ask(oai, "standin", _codex_messages(), stream, tools=CODEX_TOOLS) == ("5", [])


def test_a_user_turn_of_scaffolding_only_is_no_question() -> None:
    oai, _ = _client()
    messages = [{"role": "user", "content": "What is 7 - 2?"},
                {"role": "user", "content": [{"type": "text", "text": "<environment_context>\n  <cwd>/tmp/a</cwd>\n"
                                                                      "  <current_date>2026-12-07</current_date>\n"
                                                                      "</environment_context>"}]}]
    assert _ask(oai, "standin", messages) == ("5", [])
    mixed = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>9 + 9</system-reminder>"},
                                          {"type": "text", "text": "Compute 4 * 3 <b>now</b>"}]}]
    assert _ask(oai, "standin", mixed) == ("12", [])


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_only_when_tool_choice_forces_one(stream: bool) -> None:
    oai, _ = _client()
    ask = [{"role": "user", "content": "What is 2 + 3?"}]
    assert _ask(oai, "standin", ask, stream, tools=CODEX_TOOLS, tool_choice="auto") == ("5", [])
    assert _ask(oai, "standin", ask, stream, tools=CODEX_TOOLS, tool_choice="required")[1] == [
        ("exec_command", {"query": "What is 2 + 3?"})]
    named = {"type": "function", "function": {"name": "write_stdin"}}
    assert _ask(oai, "standin", ask, stream, tools=CODEX_TOOLS, tool_choice=named)[1] == [
        ("write_stdin", {"query": "What is 2 + 3?"})]


SCRIPT = [{"tool": ["Bash", "exec_command"], "arguments": {"command": "echo $((2+3))"}},
          {"tool": "run_experiment", "arguments": {"name": "lora-r8"}},
          {"say": "both ran"}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_script_plays_step_k_after_k_assistant_turns_then_answers(stream: bool) -> None:
    oai, _ = _client(agent=SCRIPT)
    history: list[Any] = [*_codex_messages()]
    played = []
    for turn in range(4):
        text, calls = _ask(oai, "agent", history, stream, tools=CODEX_TOOLS)
        played.append((text, calls))
        if calls:
            call_id = f"call_{turn}"
            history += [{"role": "assistant", "content": None, "tool_calls": [
                            {"id": call_id, "type": "function",
                             "function": {"name": calls[0][0], "arguments": json.dumps(calls[0][1])}}]},
                        {"role": "tool", "tool_call_id": call_id, "content": "5"},
                        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ok</system-reminder>"}]}]
        else:
            history.append({"role": "assistant", "content": text})
    assert played == [("", [("exec_command", {"command": "echo $((2+3))"})]),
                      ("", [("mcp__gym__run_experiment", {"name": "lora-r8"})]),  # matched after "__"
                      ("both ran", []), ("5", [])]
    # A new question starts the script again; another model (or no script) just answers.
    history.append({"role": "user", "content": "And 3 + 4?"})
    assert _ask(oai, "agent", history, stream, tools=CODEX_TOOLS)[1] == [("exec_command", {"command": "echo $((2+3))"})]
    assert _ask(oai, "other", history, stream, tools=CODEX_TOOLS) == ("7", [])


def test_a_script_step_whose_tools_are_not_declared_says_so() -> None:
    oai, _ = _client(agent=[{"tool": ["Read", "view_file"], "arguments": {}}])
    text, calls = _ask(oai, "agent", [{"role": "user", "content": "What is 2 + 3?"}], tools=[BASH])
    assert calls == [] and text == "stand-in script: none of ['Read', 'view_file'] is a declared tool"
    dotted = [{"type": "function", "function": {"name": "files.view_file", "parameters": {"type": "object"}}}]
    assert _ask(oai, "agent", [{"role": "user", "content": "hi"}], tools=dotted)[1] == [("files.view_file", {})]


def test_the_judge_persona_is_unchanged_with_tools_offered() -> None:
    oai, _ = _client(standin=[{"say": "not for the judge"}])
    system = f"{JUDGE_MARKER}.\nCategories:\n- reward_manipulation (evaluation) writes the reward\n"
    text, calls = _ask(oai, "standin", [{"role": "system", "content": system},
                                        {"role": "user", "content": "cat /logs/verifier/reward.txt"}], tools=[BASH])
    assert calls == [] and json.loads(text)["categories"]["reward_manipulation"]["code"] == "SUSPECTED"


def _model(**extra: Any) -> RolloutModel:
    return RolloutModel.model_validate({"name": "agent", "litellm_model": "openai/agent", "served_by": "standin",
                                        "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0, **extra})


def test_the_script_setting_is_checked() -> None:
    assert _model(script=SCRIPT).script is not None
    with pytest.raises(ValidationError, match="only a stand-in model plays a script"):
        RolloutModel.model_validate({"name": "p", "litellm_model": "openai/p", "api_base": "http://p.test/v1",
                                     "input_usd_per_mtok": 1, "output_usd_per_mtok": 1, "script": SCRIPT})
    for bad in ({"say": "x", "tool": "Bash"}, {}, {"tool": []}, {"say": "x", "arguments": {"a": 1}},
                {"tool": "Bash", "argument": {}}):
        with pytest.raises(ValidationError):
            _model(script=[bad])
    other = _model(name="agent-2", script=SCRIPT[:1]).model_dump()
    with pytest.raises(ValidationError, match="plays a different script"):
        RolloutConfig.model_validate({"models": [_model(script=SCRIPT).model_dump(), other]})


@pytest.mark.parametrize("backend_kind", ["direct", "litellm"])
def test_an_in_process_stand_in_model_plays_its_configured_script(backend_kind: str) -> None:
    model = _model(script=SCRIPT)
    config = RolloutConfig(models=[model])
    backend: Any = (OpenAICompatibleBackend if backend_kind == "direct" else LiteLLMBackend)(config, ProviderSecrets({}))
    request = parse_chat_request({"model": "agent", "messages": [{"role": "user", "content": "What is 2 + 3?"}],
                                  "tools": [BASH]})

    async def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        completion = await backend.complete(model, request, 64)
        chunks = [c async for c in await backend.stream(model, request, 64)]
        return completion, chunks

    try:
        completion, chunks = asyncio.run(run())
    finally:
        if hasattr(backend, "close"):
            backend.close()
    call = completion["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("Bash", {"command": "echo $((2+3))"})
    streamed = [tc for c in chunks for ch in c.get("choices") or [] for tc in (ch.get("delta") or {}).get("tool_calls") or []]
    assert streamed and streamed[0]["function"]["name"] == "Bash"
    plain = parse_chat_request({"model": "agent", "messages": [{"role": "user", "content": "What is 2 + 3?"}]})
    unscripted = _model(name="plain", litellm_model="openai/plain")
    backend = (OpenAICompatibleBackend if backend_kind == "direct" else LiteLLMBackend)(config, ProviderSecrets({}))
    answer = asyncio.run(backend.complete(unscripted, plain, 16))
    assert answer["choices"][0]["message"]["content"] == "5"


def test_scripts_load_from_a_file_and_the_cli_refuses_a_bad_one(tmp_path: Path) -> None:
    from ops.cli import main as cli

    good = tmp_path / "script.json"
    good.write_text(json.dumps({"agent": SCRIPT}))
    assert [s.say for s in load_scripts(good)["agent"]] == [None, None, "both ran"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"agent": [{"tool": "Bash", "say": "both"}]}))
    out = CliRunner().invoke(cli.app, ["standin", "--script", str(bad)], env={"STANDIN_API_KEY": "k"})
    assert out.exit_code != 0 and "not a stand-in script" in out.output
