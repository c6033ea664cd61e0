"""The Messages schema against what real clients send (Claude Code 2.1.332's captured request):
forwarded what the chat form carries, dropped the client's housekeeping, refused (403) what would
make a provider reach out, 422 for a declared field of the wrong type; and a model's own
``max_output_tokens`` bounds ``max_tokens`` (above the catalogue's cap as well as below)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kit.config import GymConfig
from kit.errors import PermissionDenied, Unprocessable
from services.rollout.agent_spec import count_messages_tokens, estimate_agent_messages, estimate_agent_messages_tokens
from services.rollout.anthropic import count_tokens_chat_body, to_chat_body
from services.rollout.metering import call_cost_nusd, estimate_chat, prompt_bound_tokens
from services.rollout.schemas import parse_chat_request

BODY: dict[str, Any] = json.loads((Path(__file__).parents[3] / "fixtures" / "clients" /
                                   "claude_code_2.1.332_messages.json").read_text())["body"]
QUESTION = {"role": "user", "content": "What is 2 + 3?"}


def _context(max_output_tokens: int | None = 64000) -> Any:
    model: dict[str, Any] = {"name": "agent-model", "litellm_model": "openai/x", "api_base": "http://p.test/v1",
                             "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
    if max_output_tokens:
        model["max_output_tokens"] = max_output_tokens
    return SimpleNamespace(config=GymConfig.model_validate({"agent_models": [model], "rollout": {"models": [model]}}))


def test_the_captured_body_becomes_a_chat_request_of_chat_fields_only() -> None:
    chat = to_chat_body(BODY)
    assert set(chat) == {"model", "messages", "tools", "max_tokens"}  # no metadata/user, thinking, effort, context
    request = parse_chat_request(chat)  # what the rollout code re-serializes and sends
    assert request.max_tokens == 32000 and len(request.tools or []) == len(BODY["tools"])
    # The system turn inside messages stays system text, at its place after the question.
    assert [m.role for m in request.messages] == ["system", "user", "system"]
    assert "Primary working directory" in json.dumps(chat["messages"][2])
    assert "What is 2+3?" in json.dumps(chat["messages"][1])
    text = json.dumps(chat)
    assert "cache_control" not in text and "defer_loading" not in text and "device_id" not in text


def test_housekeeping_is_dropped_and_unknown_fields_too() -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [QUESTION], "service_tier": "auto", "top_k": 5,
            "thinking": {"type": "enabled", "budget_tokens": 1024}, "output_config": {"effort": "low"},
            "context_management": {"edits": []}, "metadata": {"user_id": "u"}, "a_field_from_next_year": {"x": 1},
            "tools": [{"name": "calc", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"},
                       "defer_loading": True, "strict": True, "input_examples": [{}]}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "temperature": 0.5}
    chat = to_chat_body(body)
    assert chat == {"model": "m", "max_tokens": 8, "temperature": 0.5, "tool_choice": "required",
                    "messages": [{"role": "user", "content": "What is 2 + 3?"}],
                    "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]}


@pytest.mark.parametrize(("change", "param"), [
    ({"context_management": "clear everything"}, "context_management"),
    ({"max_tokens": "lots"}, "max_tokens"),
    ({"thinking": True}, "thinking"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"temperature": 3}, "temperature"),
])
def test_a_declared_field_of_the_wrong_type_is_a_clear_422(change: dict[str, Any], param: str) -> None:
    with pytest.raises(Unprocessable) as err:
        to_chat_body({**BODY, **change})
    assert err.value.param == param


@pytest.mark.parametrize(("change", "param"), [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, "tools.0.type"),
    ({"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}, "tools.0.type"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools.0.type"),
    ({"tools": [{"name": "no_schema"}]}, "tools.0.type"),
    ({"mcp_servers": []}, "mcp_servers"),
    ({"container": {"id": "c"}}, "container"),
])
def test_what_reaches_out_is_refused_on_messages_count_tokens_and_the_estimate(change: dict[str, Any],
                                                                               param: str) -> None:
    for call in (to_chat_body, count_tokens_chat_body, lambda b: estimate_agent_messages(b, _context())):
        with pytest.raises(PermissionDenied) as err:
            call({**BODY, **change})
        assert err.value.param == param


def test_count_tokens_takes_the_same_body_and_refuses_sampling_settings() -> None:
    context = _context()
    chat = count_tokens_chat_body(BODY)
    assert chat == {k: v for k, v in to_chat_body(BODY).items() if k != "max_tokens"}
    counted = count_messages_tokens(BODY, context.config.agent_catalogue())
    assert counted == estimate_agent_messages_tokens(BODY, context) - BODY["max_tokens"]
    for name, value in (("temperature", 0.5), ("top_k", 3), ("stop_sequences", ["x"])):
        with pytest.raises(Unprocessable) as err:
            count_tokens_chat_body({**BODY, name: value})
        assert err.value.param == name


def test_a_models_max_output_tokens_bounds_max_tokens_above_the_catalogue_cap() -> None:
    context = _context(64000)
    assert context.config.rollout.max_tokens_cap == 8192
    model = context.config.agent_catalogue().model("agent-model")
    prompt = prompt_bound_tokens(model, parse_chat_request(to_chat_body(BODY)))
    assert estimate_agent_messages(BODY, context) == call_cost_nusd(model, prompt, 32000)  # reserved for 32000
    chat = {"model": "agent-model", "messages": [QUESTION], "max_tokens": 64000}
    assert estimate_chat(chat, context) == call_cost_nusd(model, prompt_bound_tokens(
        model, parse_chat_request(chat)), 64000)  # the rollout route too
    with pytest.raises(Unprocessable) as err:
        estimate_agent_messages({**BODY, "max_tokens": 64001}, context)
    assert err.value.param == "max_tokens" and "64000" in str(err.value) and "agent-model" in str(err.value)


def test_a_model_without_its_own_cap_keeps_the_catalogues_and_a_lower_own_cap_wins() -> None:
    with pytest.raises(Unprocessable) as err:
        estimate_agent_messages(BODY, _context(None))
    assert "8192" in str(err.value) and "max_tokens_cap" in str(err.value)
    with pytest.raises(Unprocessable) as lower:
        estimate_agent_messages({**BODY, "max_tokens": 4097}, _context(4096))
    assert "4096" in str(lower.value)
    assert estimate_agent_messages({**BODY, "max_tokens": 4096}, _context(4096)) > 0
