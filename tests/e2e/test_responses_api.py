"""The OpenAI Responses API through the gym (``POST /v1/responses``): the unmodified openai SDK's
``client.responses`` and Codex's captured first request, on the agent route (the run's agent
meter, exact; every turn kept), the rollout route (the service budget) and ``/openai/v1``,
against the stand-in provider. Server tools and provider-side state are refused before anything
is held."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from storage.tables import LedgerEntry
from tests.conftest import admin_headers, bearer
from tests.e2e.test_agent_route import QUESTION, _balance, _run_key, _trajectory, agent_config, live  # noqa: F401
from tests.fakes.servers import serve_gym

CODEX = json.loads((Path(__file__).parents[1] / "fixtures/clients/codex_0.171.0_responses.json").read_text())
CALCULATOR: Any = {"type": "function", "name": "calculate", "description": "Evaluates an arithmetic question.",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
              "strict": False}


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event line, data) of every SSE event of a Responses stream."""
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if line.startswith(("event: ", "data: ")))
        if "data" in lines:
            out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


def _ledger(gym: Any, key_id: str) -> list[LedgerEntry]:
    with gym.gateway.store.transaction() as s:
        return list(s.scalars(select(LedgerEntry).where(LedgerEntry.key_id == key_id)).all())


def test_openai_sdk_responses_plain_and_streaming_on_the_agent_meter(live: Any, teacher_secret: str) -> None:  # noqa: F811
    url, client, key = live
    before = _balance(client, key["key"])
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key["key"], max_retries=0)

    raw = oai.responses.with_raw_response.create(model="agent-llm", input=QUESTION, max_output_tokens=16,
                                                 instructions="Answer with the number only.", store=False)
    response = raw.parse()
    assert response.object == "response" and response.status == "completed" and response.model == "agent-llm"
    assert response.output_text == "5"
    assert response.usage is not None and response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    plain_cost = float(raw.headers["X-RSIGym-Cost-USD"])
    assert plain_cost == pytest.approx((response.usage.input_tokens + 2 * response.usage.output_tokens) / 1e6)
    assert json.loads(raw.http_response.text)["usage"]["cost_usd"] == pytest.approx(plain_cost)

    events = list(oai.responses.create(model="agent-llm", input=[{"role": "user", "content": QUESTION}],
                                       max_output_tokens=16, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
                 "response.output_text.done", "response.content_part.done", "response.output_item.done"):
        assert kind in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "5"
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == "5" and completed.usage is not None
    stream_cost = (completed.usage.input_tokens + 2 * completed.usage.output_tokens) / 1e6

    with oai.responses.stream(model="agent-llm", input=QUESTION, max_output_tokens=16) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "5" and final.output_text == "5" and final.usage is not None
    helper_cost = (final.usage.input_tokens + 2 * final.usage.output_tokens) / 1e6

    after = _balance(client, key["key"])
    assert {k: after[k] for k in ("spent_usd", "reserved_usd")} == {k: before[k] for k in ("spent_usd", "reserved_usd")}
    assert after["agent_model"]["spent_usd"] == pytest.approx(plain_cost + stream_cost + helper_cost)
    assert after["agent_model"]["reserved_usd"] == 0

    turns = _trajectory(client, key["id"])
    assert [(t["api"], t["stream"], t["model"]) for t in turns] == [("responses", False, "agent-llm"),
                                                                     ("responses", True, "agent-llm"),
                                                                     ("responses", True, "agent-llm")]
    assert [t["response"]["text"] for t in turns] == ["5", "5", "5"]
    assert turns[0]["request"]["input"] == QUESTION and turns[0]["cost_usd"] == pytest.approx(plain_cost)
    assert sum(t["cost_usd"] for t in turns) == pytest.approx(after["agent_model"]["spent_usd"])
    assert teacher_secret not in json.dumps(turns)


def test_a_function_tool_loop(live: Any) -> None:  # noqa: F811
    url, client, key = live
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key["key"], max_retries=0)
    asked: Any = [{"role": "user", "content": QUESTION}]
    first = oai.responses.create(model="agent-llm", input=asked, tools=[CALCULATOR],
                                 tool_choice="required", max_output_tokens=64)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "calculate" and calls[0].call_id
    json.loads(calls[0].arguments)  # the arguments are JSON
    history: list[Any] = [*asked, *[c.model_dump(exclude_none=True) for c in calls],
                          {"type": "function_call_output", "call_id": calls[0].call_id, "output": "5"}]
    second = oai.responses.create(model="agent-llm", input=history, tools=[CALCULATOR],
                                  max_output_tokens=64)
    assert second.status == "completed" and second.output_text == "5"

    with oai.responses.stream(model="agent-llm", input=asked, tools=[CALCULATOR],
                              tool_choice="required", max_output_tokens=64) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    streamed = [item for item in final.output if item.type == "function_call"]
    assert streamed and streamed[0].name == "calculate"
    turns = _trajectory(client, key["id"])
    assert [t["response"]["tool_calls"][0]["name"] if t["response"]["tool_calls"] else None for t in turns] == \
        ["calculate", None, "calculate"]
    assert turns[1]["request"]["input"][-1] == {"type": "function_call_output", "call_id": calls[0].call_id,
                                                "output": "5"}


def test_codex_first_request_streams_a_completed_response(live: Any) -> None:  # noqa: F811
    url, client, key = live
    body = copy.deepcopy(CODEX["body"])
    body["model"] = "agent-llm"
    body["tools"] = [t for t in body["tools"] if t["type"] != "web_search"]  # the launcher disables web search
    with httpx.stream("POST", f"{url}/agent/v1/responses", json=body, timeout=60,
                      headers={**CODEX["headers"], **bearer(key["key"])}) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        text = answer.read().decode()
    events = _events(text)
    assert all(name == data["type"] for name, data in events)  # Codex dispatches on the data's type
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert events[0][1]["type"] == "response.created" and events[-1][1]["type"] == "response.completed"
    completed = events[-1][1]["response"]
    assert completed["status"] == "completed" and completed["output"]
    usage = completed["usage"]
    assert usage["input_tokens"] > 1000 and usage["output_tokens"] > 0  # the whole Codex prompt was sent
    assert "rsigym-cost" not in text  # the gateway settles on the trailer and strips it
    balance = _balance(client, key["key"])
    assert balance["agent_model"]["spent_usd"] == pytest.approx(usage["cost_usd"]) and balance["spent_usd"] == 0
    assert balance["agent_model"]["reserved_usd"] == 0
    turn = _trajectory(client, key["id"])[0]
    assert turn["stream"] and turn["cost_usd"] == pytest.approx(usage["cost_usd"])


def test_namespace_tools_come_back_as_codex_calls_them(live: Any) -> None:  # noqa: F811
    url, client, key = live
    namespace = {"type": "namespace", "name": "mcp__gym", "description": "The gym's tools.",
                 "tools": [{**CALCULATOR, "name": "calc"}]}
    body = {"model": "agent-llm", "input": QUESTION, "tools": [namespace],
            "tool_choice": "required", "store": False, "max_output_tokens": 64}
    answer = client.post("/agent/v1/responses", json=body, headers=bearer(key["key"]))
    assert answer.status_code == 200, answer.text
    call = next(item for item in answer.json()["output"] if item["type"] == "function_call")
    assert (call["namespace"], call["name"]) == ("mcp__gym", "calc")
    streamed = client.post("/agent/v1/responses", json={**body, "stream": True}, headers=bearer(key["key"]))
    done = [d["item"] for _, d in _events(streamed.text) if d["type"] == "response.output_item.done"]
    assert [(i["namespace"], i["name"]) for i in done if i["type"] == "function_call"] == [("mcp__gym", "calc")]


def test_refusals_hold_nothing_and_reach_no_provider(make_gym: Any, standin: Any) -> None:
    gym = make_gym(config=agent_config(standin[0]))
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        key = _run_key(client)
        served_before = len(standin[1].state.requests)
        oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key["key"], max_retries=0)
        server_tools: list[Any] = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
                                   {"type": "code_interpreter", "container": {"type": "auto"}},
                                   {"type": "mcp", "server_label": "x", "server_url": "https://example.com"}]
        for tool in server_tools:
            with pytest.raises(openai.PermissionDeniedError) as refused:
                oai.responses.create(model="agent-llm", input=QUESTION, tools=[tool])
            assert "refused" in str(refused.value)
        with pytest.raises(openai.PermissionDeniedError):  # Codex's own: web search without live access
            oai.responses.create(model="agent-llm", input=QUESTION, tools=[{"type": "web_search",
                                                                          "external_web_access": False}])
        with pytest.raises(openai.PermissionDeniedError) as stored:
            oai.responses.create(model="agent-llm", input=QUESTION, store=True)
        assert "store" in str(stored.value)
        for field, value in (("previous_response_id", "resp_1"), ("background", True),
                             ("conversation", "conv_1")):
            answer = client.post("/agent/v1/responses", headers=bearer(key["key"]),
                                 json={"model": "agent-llm", "input": QUESTION, field: value})
            assert answer.status_code == 422 and "provider-side state" in answer.json()["error"]["message"]
        assert len(standin[1].state.requests) == served_before
        balance = _balance(client, key["key"])
        assert balance["agent_model"]["spent_usd"] == 0 and balance["agent_model"]["reserved_usd"] == 0
        assert _trajectory(client, key["id"]) == []
    assert _ledger(gym, key["agent_meter_id"]) == [] and _ledger(gym, key["id"]) == []


def test_rollout_and_openai_routes_answer_on_the_service_budget(make_gym: Any, standin: Any) -> None:
    gym = make_gym(config=agent_config(standin[0]))
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        key = _run_key(client)
        spent = 0.0
        for base in ("/rollout/v1", "/openai/v1"):
            oai = openai.OpenAI(base_url=f"{url}{base}", api_key=key["key"], max_retries=0)
            raw = oai.responses.with_raw_response.create(model="teacher", input=QUESTION, max_output_tokens=16)
            assert raw.parse().output_text == "5"
            spent += float(raw.headers["X-RSIGym-Cost-USD"])
            events = list(oai.responses.create(model="teacher", input=QUESTION, max_output_tokens=16, stream=True))
            last: Any = events[-1]
            assert last.type == "response.completed" and last.response.output_text == "5"
            usage = last.response.usage
            spent += (usage.input_tokens + 2 * usage.output_tokens) / 1e6
        balance = _balance(client, key["key"])
        assert balance["spent_usd"] == pytest.approx(spent) and balance["reserved_usd"] == 0
        assert balance["agent_model"]["spent_usd"] == 0
        oai = openai.OpenAI(base_url=f"{url}/openai/v1", api_key=key["key"], max_retries=0)
        with pytest.raises(openai.BadRequestError) as not_here:
            oai.responses.create(model="base-model", input=QUESTION)
        assert "chat/completions" in str(not_here.value)
        assert client.post("/openai/v1/responses", json={"model": "teacher", "input": QUESTION}).status_code == 401
        assert admin_headers()  # the admin API stays apart from these routes
