"""Claude Code's own requests on the agent route (/agent/v1/messages): the body Claude Code
2.1.332 sent (tests/fixtures/clients, captured as it was, housekeeping fields, beta headers, a
system turn inside ``messages`` and all) is served by a real gateway, streaming and not, billed
on the run's agent meter and kept as a trajectory turn; what would make a provider reach out is
refused before anything is held; and a scripted stand-in plays a tool call through the
unmodified ``anthropic`` SDK, then answers once it has the tool's result."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from kit.config import GymConfig
from services.rollout.agent_spec import estimate_agent_messages, estimate_agent_messages_tokens
from tests.conftest import TEACHER_ENV, admin_headers, bearer, gym_config
from tests.fakes.servers import serve_gym

CAPTURED = json.loads((Path(__file__).parents[1] / "fixtures" / "clients" / "claude_code_2.1.332_messages.json")
                      .read_text())
BODY: dict[str, Any] = CAPTURED["body"]


def _config(api_base: str) -> GymConfig:
    agent_models = GymConfig.model_validate({"agent_models": [
        # The model the captured body names, behind the stand-in provider as a real provider would be.
        {"name": "agent-model", "litellm_model": "openai/teacher", "api_base": api_base, "api_key_env": TEACHER_ENV,
         "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0, "max_output_tokens": 64000},
        {"name": "scripted", "litellm_model": "openai/scripted", "served_by": "standin",
         "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0, "max_output_tokens": 64000,
         "script": [{"tool": ["exec_command", "Bash"], "arguments": {"command": "echo $((2+3))",
                                                                      "description": "add"}}]},
    ]}).agent_models
    return gym_config(api_base).model_copy(update={"agent_models": agent_models})


@pytest.fixture
def live(make_gym: Any, standin: Any) -> Any:
    gym = make_gym(config=_config(standin[0]))
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        created = client.post("/admin/v1/keys", headers=admin_headers(),
                              json={"track": "joint", "budget_usd": 1.0, "agent_budget_usd": 1.0})
        assert created.status_code == 201, created.text
        yield gym, url, client, created.json()


def _headers(key: str) -> dict[str, str]:
    """The captured request's headers, with the run key as Claude Code sends its key."""
    return {**CAPTURED["headers"], "x-api-key": key, "content-type": "application/json"}


def _sse_text(raw: str) -> tuple[str, list[str]]:
    text, kinds = [], []
    for line in raw.splitlines():
        if line.startswith("data:"):
            event = json.loads(line[5:])
            kinds.append(event["type"])
            if event["type"] == "content_block_delta" and event["delta"].get("type") == "text_delta":
                text.append(event["delta"]["text"])
    return "".join(text), kinds


def _meter(client: httpx.Client, key: dict[str, Any]) -> list[dict[str, Any]]:
    r = client.get(f"/admin/v1/keys/{key['agent_meter_id']}/ledger", headers=admin_headers())
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def _turns(client: httpx.Client, key: dict[str, Any]) -> list[dict[str, Any]]:
    return client.get(f"/admin/v1/runs/{key['id']}/trajectory", headers=admin_headers()).json()["data"]


def test_the_captured_claude_code_body_is_answered_streaming_and_not(live: Any, standin: Any) -> None:
    gym, url, client, key = live
    path = f"{url}/agent{CAPTURED['path']}"  # /agent/v1/messages?beta=true
    with client.stream("POST", path, headers=_headers(key["key"]), json=BODY) as r:
        assert r.status_code == 200, r.read()
        streamed, kinds = _sse_text(r.read().decode())
    assert streamed == "5"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"

    plain = client.post(path, headers=_headers(key["key"]), json={**BODY, "stream": False})
    assert plain.status_code == 200, plain.text
    assert [b["text"] for b in plain.json()["content"] if b["type"] == "text"] == ["5"]

    # What reached the provider: chat fields only; the in-conversation system turn kept as system text.
    sent = standin[1].state.requests[-1]
    assert not {"context_management", "output_config", "metadata", "thinking", "user"} & set(sent)
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "system"]
    assert "Primary working directory" in json.dumps(sent["messages"][2])
    assert len(sent["tools"]) == len(BODY["tools"]) and "defer_loading" not in json.dumps(sent["tools"])
    assert "cache_control" not in json.dumps(sent)

    # Billed on the agent meter, each reservation for the full 32000 tokens asked (the model's own
    # max_output_tokens allows it), settled at the usage; the service budget untouched.
    rows = _meter(client, key)
    assert len(rows) == 2 and {r["status"] for r in rows} == {"settled"}
    per_call = estimate_agent_messages(BODY, gym.gateway.context)
    assert per_call >= 32000 * 2 * 1000  # 32000 output tokens at $2 / Mtok, in nano-USD
    assert [r["estimate_usd"] for r in rows] == pytest.approx([per_call / 1e9] * 2)
    balance = client.get("/v1/balance", headers=bearer(key["key"])).json()
    assert balance["spent_usd"] == 0 and balance["agent_model"]["reserved_usd"] == 0
    assert balance["agent_model"]["spent_usd"] == pytest.approx(sum(r["actual_usd"] for r in rows))
    turns = _turns(client, key)
    assert [(t["api"], t["stream"], t["model"], t["response"]["text"]) for t in turns] == [
        ("anthropic", True, "agent-model", "5"), ("anthropic", False, "agent-model", "5")]
    assert turns[0]["request"]["messages"][0]["content"][1]["text"] == "What is 2+3?"


def test_the_unmodified_sdk_sends_the_same_request(live: Any) -> None:
    _, url, _, key = live
    claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
    extra = {k: BODY[k] for k in ("thinking", "context_management", "output_config")}
    kwargs: Any = {"model": "agent-model", "max_tokens": BODY["max_tokens"], "system": BODY["system"],
                   "messages": BODY["messages"], "tools": BODY["tools"], "metadata": BODY["metadata"],
                   "extra_body": extra, "extra_headers": {"anthropic-beta": CAPTURED["headers"]["anthropic-beta"]}}
    message = claude.messages.create(timeout=60, **kwargs)  # a timeout: the SDK would insist on streaming 32000
    assert [b.text for b in message.content if b.type == "text"] == ["5"] and message.stop_reason == "end_turn"
    with claude.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert "".join(b.text for b in final.content if b.type == "text") == "5"
    counted = claude.messages.count_tokens(model="agent-model", system=BODY["system"], messages=BODY["messages"],
                                           tools=BODY["tools"], extra_body=extra)
    assert counted.input_tokens >= message.usage.input_tokens > 0


def test_count_tokens_takes_the_captured_body(live: Any, standin: Any) -> None:
    gym, url, client, key = live
    served = len(standin[1].state.requests)
    r = client.post(f"{url}/agent/v1/messages/count_tokens?beta=true", headers=_headers(key["key"]), json=BODY)
    assert r.status_code == 200, r.text
    # The reservation of the same body is this count plus its max_tokens.
    assert r.json()["input_tokens"] == estimate_agent_messages_tokens(BODY, gym.gateway.context) - BODY["max_tokens"]
    assert len(standin[1].state.requests) == served and _meter(client, key) == []


def test_max_tokens_is_bounded_by_the_models_own_cap(live: Any) -> None:
    _, url, client, key = live
    over = client.post(f"{url}/agent/v1/messages", headers=_headers(key["key"]),
                       json={**BODY, "stream": False, "max_tokens": 64001})
    assert over.status_code == 422, over.text
    error = over.json()["error"]
    assert error["param"] == "max_tokens" and "64000" in error["message"] and "agent-model" in error["message"]
    assert _meter(client, key) == []


@pytest.mark.parametrize(("change", "param"), [
    ({"tools": [*BODY["tools"], {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]},
     f"tools.{len(BODY['tools'])}.type"),
    ({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, "tools.0.type"),
    ({"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}, "tools.0.type"),
    ({"mcp_servers": [{"type": "url", "url": "https://mcp.example.test/sse", "name": "x"}]}, "mcp_servers"),
    ({"container": "container_011CPR5CNjB747bTd36fQLFk"}, "container"),
])
def test_what_would_make_the_provider_reach_out_is_refused_before_anything_is_held(
        live: Any, standin: Any, change: dict[str, Any], param: str) -> None:
    _, url, client, key = live
    served = len(standin[1].state.requests)
    for stream in (True, False):
        r = client.post(f"{url}/agent/v1/messages?beta=true", headers=_headers(key["key"]),
                        json={**BODY, **change, "stream": stream})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "permission_denied" and r.json()["error"]["param"] == param
    counted = client.post(f"{url}/agent/v1/messages/count_tokens", headers=_headers(key["key"]),
                          json={**BODY, **change})
    assert counted.status_code == 403, counted.text
    assert len(standin[1].state.requests) == served  # no provider was asked
    assert _meter(client, key) == [] and _turns(client, key) == []
    balance = client.get("/v1/balance", headers=bearer(key["key"])).json()
    assert balance["agent_model"]["spent_usd"] == 0 and balance["agent_model"]["reserved_usd"] == 0


def test_the_sdk_refuses_a_server_tool_with_permission_denied(live: Any) -> None:
    _, url, client, key = live
    claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError):
        claude.messages.create(model="agent-model", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert _meter(client, key) == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_scripted_stand_in_calls_bash_then_answers_with_the_result(live: Any, stream: bool) -> None:
    _, url, client, key = live
    claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
    messages: list[Any] = copy.deepcopy(BODY["messages"][:1])  # the <system-reminder> and "What is 2+3?"
    ask: Any = {"model": "scripted", "max_tokens": 32000, "system": BODY["system"], "tools": BODY["tools"]}

    def send(history: list[Any]) -> Any:
        if not stream:
            return claude.messages.create(messages=history, timeout=60, **ask)
        with claude.messages.stream(messages=history, **ask) as s:
            return s.get_final_message()

    first = send(messages)
    assert first.stop_reason == "tool_use"
    [call] = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "Bash" and call.input == {"command": "echo $((2+3))", "description": "add"}
    # The client runs the tool and sends its result back (with a reminder, as Claude Code does).
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "5\n"},
                                              {"type": "text", "text": "<system-reminder>\nkeep going\n"
                                                                       "</system-reminder>"}]}]
    second = send(messages)
    assert [b.text for b in second.content if b.type == "text"] == ["5"] and second.stop_reason == "end_turn"

    turns = _turns(client, key)
    assert [(t["model"], t["stream"]) for t in turns] == [("scripted", stream)] * 2
    assert [c["name"] for c in turns[0]["response"]["tool_calls"]] == ["Bash"]
    assert turns[1]["response"]["text"] == "5"
    assert client.get("/v1/balance", headers=bearer(key["key"])).json()["agent_model"]["spent_usd"] > 0
