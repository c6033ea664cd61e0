"""The rollout service as agents use it: the unmodified openai client, streaming with exact
metering, tool calls, refusals of provider-side fetching, and no leaked holds."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from services.rollout.standin import create_standin_app
from tests.conftest import admin_headers, bearer, create_key, gym_config
from tests.fakes.servers import serve, serve_gym


@pytest.fixture
def live(gym: Any) -> Any:
    with serve_gym(gym) as url:
        client = httpx.Client(base_url=url, timeout=60)
        key = create_key(client, 1.0)
        yield url, client, key
        client.close()


def _ledger(client: httpx.Client, key_id: str) -> list[dict[str, Any]]:
    return client.get(f"/admin/v1/keys/{key_id}/ledger", headers=admin_headers()).json()["data"]


def test_openai_client_gets_completions(live: Any) -> None:
    url, client, key = live
    oai = openai.OpenAI(base_url=f"{url}/rollout/v1", api_key=key["key"], max_retries=0)
    raw = oai.chat.completions.with_raw_response.create(
        model="teacher", messages=[{"role": "user", "content": "What is 17 + 25?"}], max_tokens=16
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "42"
    assert completion.usage and completion.usage.prompt_tokens > 0
    cost = float(raw.headers["X-RSIGym-Cost-USD"])
    assert cost == pytest.approx((completion.usage.prompt_tokens * 1.0 + completion.usage.completion_tokens * 2.0) / 1e6)
    assert [m.id for m in oai.models.list()] == ["teacher", "judge"]


def test_streaming_is_metered_token_exactly(live: Any) -> None:
    url, client, key = live
    oai = openai.OpenAI(base_url=f"{url}/rollout/v1", api_key=key["key"], max_retries=0)
    stream = oai.chat.completions.create(
        model="teacher", messages=[{"role": "user", "content": "Say something."}], max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens == 12
    rows = _ledger(client, key["id"])
    assert len(rows) == 1 and rows[0]["status"] == "settled"
    expected = (usage.prompt_tokens * 1.0 + usage.completion_tokens * 2.0) / 1e6
    assert rows[0]["actual_usd"] == pytest.approx(expected)
    assert usage.model_extra and usage.model_extra["cost_usd"] == pytest.approx(expected)
    balance = client.get("/v1/balance", headers=bearer(key["key"])).json()
    assert balance["spent_usd"] == pytest.approx(expected) and balance["reserved_usd"] == 0


def test_stream_without_usage_request_is_still_charged(live: Any) -> None:
    url, client, key = live
    with client.stream("POST", "/rollout/v1/chat/completions", headers=bearer(key["key"]),
                       json={"model": "teacher", "messages": [{"role": "user", "content": "go"}], "max_tokens": 5,
                             "stream": True}) as r:
        body = r.read().decode()
    assert "rsigym-cost" not in body and "usage" not in body and body.rstrip().endswith("data: [DONE]")
    rows = _ledger(client, key["id"])
    assert rows[0]["actual_usd"] and rows[0]["actual_usd"] > 0


def test_tool_calls_come_back_in_openai_shape(live: Any) -> None:
    url, client, key = live
    oai = openai.OpenAI(base_url=f"{url}/rollout/v1", api_key=key["key"], max_retries=0)
    tools = [{"type": "function", "function": {"name": "search_notes", "description": "search",
                                               "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]
    completion = oai.chat.completions.create(
        model="teacher", messages=[{"role": "user", "content": "find lora notes"}], tools=tools, max_tokens=32,
        tool_choice="required",
    )
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "search_notes"
    assert json.loads(call.function.arguments) == {"query": "find lora notes"}
    assert completion.choices[0].finish_reason == "tool_calls"
    # Offered, not forced: the stand-in answers (an agent CLI offers its tools on every turn).
    answer = oai.chat.completions.create(
        model="teacher", messages=[{"role": "user", "content": "What is 2 + 3?"}], tools=tools, max_tokens=32)
    assert answer.choices[0].message.content == "5" and not answer.choices[0].message.tool_calls


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"web_search_options": {}}, "web_search_options"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]},
         "messages.0.content.0"),
        ({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-123"}}]}]},
         "messages.0.content.0"),
        ({"api_base": "http://169.254.169.254/"}, "api_base"),
        ({"extra_body": {"x": 1}}, "extra_body"),
    ],
)
def test_provider_side_fetching_is_refused_before_anything_is_reserved(live: Any, standin: Any, extra: dict[str, Any], param: str) -> None:
    url, client, key = live
    before = len(standin[1].state.requests)
    body = {"model": "teacher", "messages": [{"role": "user", "content": "hi"}], **extra}
    r = client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key["key"]))
    assert r.status_code == 403, r.text
    assert r.json()["error"]["type"] == "permission_denied" and r.json()["error"]["param"] == param
    assert len(standin[1].state.requests) == before
    assert _ledger(client, key["id"]) == []


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "teacher", "messages": []}, 422, "messages"),
        ({"model": "teacher", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, 422, "max_tokens"),
        ({"model": "teacher", "messages": [{"role": "user", "content": "x"}], "logit_biass": {}}, 422, "logit_biass"),
        ({"model": "nobody", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        ({"model": "teacher", "messages": [{"role": "wizard", "content": "x"}]}, 422, "messages.0.role"),
    ],
)
def test_bad_requests_get_clear_errors_and_cost_nothing(live: Any, body: dict[str, Any], status: int, param: str) -> None:
    url, client, key = live
    r = client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key["key"]))
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert _ledger(client, key["id"]) == []
    r = client.post("/rollout/v1/chat/completions", content=b"{not json", headers=bearer(key["key"]))
    assert r.status_code == 422


def test_client_disconnect_mid_stream_bills_the_hold_and_leaks_nothing(live: Any) -> None:
    url, client, key = live
    body = {"model": "teacher", "messages": [{"role": "user", "content": "talk"}], "max_tokens": 400, "stream": True}
    with client.stream("POST", "/rollout/v1/chat/completions", headers=bearer(key["key"]), json=body) as r:
        estimate = float(r.headers["X-RSIGym-Cost-USD"])
        next(r.iter_raw())  # read a little, then hang up
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = _ledger(client, key["id"])
        if rows and rows[0]["status"] != "reserved":
            break
        time.sleep(0.1)
    assert rows[0]["status"] == "settled"
    assert 0 < rows[0]["actual_usd"] <= estimate
    balance = client.get("/v1/balance", headers=bearer(key["key"])).json()
    assert balance["reserved_usd"] == 0


def test_concurrency_cap_refuses_with_429_while_a_stream_is_open(make_gym: Any, teacher_secret: str) -> None:
    slow = create_standin_app(teacher_secret, token_delay_s=0.02)
    with serve(slow) as slow_url, serve(make_gym(config=gym_config(slow_url + "/v1")).app) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        policy = {"services": {"rollout": {"max_concurrency": 1}}}
        key = client.post("/admin/v1/keys", json={"policy": policy, "budget_usd": 1}, headers=admin_headers()).json()["key"]
        body = {"model": "teacher", "messages": [{"role": "user", "content": "talk"}], "max_tokens": 200, "stream": True}
        with client.stream("POST", "/rollout/v1/chat/completions", headers=bearer(key), json=body) as r:
            chunks = r.iter_raw()  # keep the iterator: dropping it would close the stream
            next(chunks)
            second = client.post("/rollout/v1/chat/completions", headers=bearer(key),
                                 json={**body, "stream": False, "max_tokens": 2})
            assert second.status_code == 429 and second.json()["error"]["type"] == "concurrency_limit"
        deadline = time.monotonic() + 10  # the slot comes back once the gateway sees the hang-up
        while time.monotonic() < deadline:
            third = client.post("/rollout/v1/chat/completions", headers=bearer(key), json={**body, "stream": False, "max_tokens": 2})
            if third.status_code != 429:
                break
            time.sleep(0.1)
        assert third.status_code == 200


def test_openai_client_sees_402_as_a_status_error(gym: Any) -> None:
    with serve_gym(gym) as url, httpx.Client(base_url=url) as client:
        key = create_key(client, 0.0)["key"]
        oai = openai.OpenAI(base_url=f"{url}/rollout/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            oai.chat.completions.create(model="teacher", messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 402
        assert info.value.body["type"] == "budget_exhausted"
