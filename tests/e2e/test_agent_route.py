"""The research agent's own model through the gym (/agent/v1): the unmodified openai and
anthropic SDKs, plain and streaming, against the stand-in provider; billed on the run's
agent-model meter (never the service budget), failing closed; every turn kept as the
trajectory; no provider key anywhere the agent or the trajectory can see."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import anthropic
import httpx
import openai
import pytest
from sqlalchemy import select

from billing import rate_limits
from kit.config import GymConfig, load_config
from kit.settings import StoreSettings
from services.records.agent_turns import AgentTurn
from services.records.events import CALL_REFUSED
from services.rollout.agent_spec import estimate_agent_chat, estimate_agent_chat_tokens, estimate_agent_messages_tokens
from services.rollout.metering import estimate_chat_tokens
from storage.store import Store
from storage.tables import LedgerEntry
from tests.conftest import PG_URL, TEACHER_ENV, admin_headers, bearer, gym_config
from tests.fakes.servers import serve_gym

QUESTION = "What is 2 + 3?"


def agent_config(api_base: str, input_price: float = 1.0) -> GymConfig:
    config = gym_config(api_base)
    return config.model_copy(update={"agent_models": GymConfig.model_validate({"agent_models": [
        {"name": "agent-llm", "litellm_model": "openai/teacher", "api_base": api_base, "api_key_env": TEACHER_ENV,
         "input_usd_per_mtok": input_price, "output_usd_per_mtok": 2.0}]}).agent_models})


def _run_key(client: httpx.Client, budget: float = 1.0, agent_budget: float | None = 1.0) -> dict[str, Any]:
    body: dict[str, Any] = {"track": "joint", "budget_usd": budget}
    if agent_budget is not None:
        body["agent_budget_usd"] = agent_budget
    created = client.post("/admin/v1/keys", json=body, headers=admin_headers())
    assert created.status_code == 201, created.text
    return created.json()


@pytest.fixture
def live(make_gym: Any, standin: Any) -> Any:
    gym = make_gym(config=agent_config(standin[0]))
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield url, client, _run_key(client)


def _balance(client: httpx.Client, key: str) -> dict[str, Any]:
    return client.get("/v1/balance", headers=bearer(key)).json()


def _trajectory(client: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    return client.get(f"/admin/v1/runs/{run_id}/trajectory", headers=admin_headers()).json()["data"]


def test_openai_sdk_plain_and_streaming_on_the_agent_meter(live: Any, teacher_secret: str) -> None:
    url, client, key = live
    before = _balance(client, key["key"])
    assert before["agent_model"] == {"budget_usd": 1.0, "spent_usd": 0.0, "reserved_usd": 0.0, "remaining_usd": 1.0}
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key["key"], max_retries=0)
    assert [m.id for m in oai.models.list()] == ["agent-llm"]  # the agent catalogue, not rollout's
    raw = oai.chat.completions.with_raw_response.create(
        model="agent-llm", messages=[{"role": "user", "content": QUESTION}], max_tokens=16)
    completion = raw.parse()
    assert completion.choices[0].message.content == "5"
    plain_cost = float(raw.headers["X-RSIGym-Cost-USD"])
    assert completion.usage is not None
    assert plain_cost == pytest.approx((completion.usage.prompt_tokens + 2 * completion.usage.completion_tokens) / 1e6)
    chunks = list(oai.chat.completions.create(model="agent-llm", messages=[{"role": "user", "content": QUESTION}],
                                              max_tokens=16, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "5"
    usage = chunks[-1].usage
    assert usage is not None
    stream_cost = (usage.prompt_tokens + 2 * usage.completion_tokens) / 1e6

    after = _balance(client, key["key"])
    assert {k: after[k] for k in ("budget_usd", "spent_usd", "reserved_usd", "remaining_usd")} == \
        {k: before[k] for k in ("budget_usd", "spent_usd", "reserved_usd", "remaining_usd")}  # service budget untouched
    assert after["agent_model"]["spent_usd"] == pytest.approx(plain_cost + stream_cost)
    assert after["agent_model"]["reserved_usd"] == 0

    turns = _trajectory(client, key["id"])
    assert [(t["api"], t["stream"], t["model"]) for t in turns] == [("openai", False, "agent-llm"),
                                                                     ("openai", True, "agent-llm")]
    assert [t["response"]["text"] for t in turns] == ["5", "5"]
    assert turns[0]["request"]["messages"][0]["content"] == QUESTION
    assert turns[0]["key_id"] == key["id"] and turns[0]["cost_usd"] == pytest.approx(plain_cost)
    text = client.get(f"/admin/v1/runs/{key['id']}/trajectory?text=true", headers=admin_headers()).text
    assert QUESTION in text and "[model] 5" in text
    assert teacher_secret not in json.dumps(turns) and teacher_secret not in text


def test_anthropic_sdk_plain_and_streaming(live: Any, teacher_secret: str) -> None:
    url, client, key = live
    claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
    message = claude.messages.create(model="agent-llm", max_tokens=16, system="Answer with the number only.",
                                     messages=[{"role": "user", "content": QUESTION}])
    assert message.type == "message" and message.role == "assistant"
    assert [b.text for b in message.content if b.type == "text"] == ["5"]
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    with claude.messages.stream(model="agent-llm", max_tokens=16,
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert "".join(b.text for b in final.content if b.type == "text") == "5"
    assert events[0] == "message_start" and "content_block_delta" in events and events[-1] == "message_stop"
    assert final.usage.output_tokens > 0

    balance = _balance(client, key["key"])
    assert balance["spent_usd"] == 0 and balance["agent_model"]["spent_usd"] > 0
    assert balance["agent_model"]["reserved_usd"] == 0
    turns = _trajectory(client, key["id"])
    assert [(t["api"], t["stream"]) for t in turns] == [("anthropic", False), ("anthropic", True)]
    assert [t["response"]["text"] for t in turns] == ["5", "5"]
    assert turns[0]["request"]["system"] == "Answer with the number only."
    assert sum(t["cost_usd"] for t in turns) == pytest.approx(balance["agent_model"]["spent_usd"])
    assert teacher_secret not in json.dumps(turns)


def test_a_child_key_calls_it_on_the_same_meter(live: Any) -> None:
    url, client, key = live
    child = client.post("/v1/keys", json={"name": "worker"}, headers=bearer(key["key"])).json()
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=child["key"], max_retries=0)
    reply = oai.chat.completions.create(model="agent-llm", messages=[{"role": "user", "content": QUESTION}],
                                        max_tokens=8)
    assert reply.choices[0].message.content == "5"
    assert _balance(client, key["key"])["agent_model"]["spent_usd"] > 0
    assert _trajectory(client, key["id"])[0]["key_id"] == child["id"]


def test_refusals_run_without_agent_budget_and_models_outside_the_catalogue(live: Any) -> None:
    url, client, key = live
    bare = _run_key(client, agent_budget=None)
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=bare["key"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as no_meter:
        oai.chat.completions.create(model="agent-llm", messages=[{"role": "user", "content": QUESTION}], max_tokens=8)
    assert "agent-model budget" in str(no_meter.value)
    assert _balance(client, bare["key"])["agent_model"] is None

    for model in ("teacher", "gpt-4o"):  # a rollout model is not an agent model; nor is a provider's name
        oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key["key"], max_retries=0)
        with pytest.raises(openai.PermissionDeniedError):
            oai.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=8)
        claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
        with pytest.raises(anthropic.PermissionDeniedError):
            claude.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": QUESTION}])
    claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError):  # a server tool would make the provider fetch
        claude.messages.create(model="agent-llm", max_tokens=8, messages=[{"role": "user", "content": QUESTION}],
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert _trajectory(client, key["id"]) == [] and _balance(client, key["key"])["agent_model"]["spent_usd"] == 0
    events = client.get(f"/admin/v1/runs/{key['id']}/events", headers=admin_headers()).json()["data"]
    refused = [e["data"] for e in events if e["kind"] == "call.refused"]
    assert len(refused) == 5 and {r["service"] for r in refused} == {"agent"} and {r["status"] for r in refused} == {403}
    no_key = httpx.post(f"{url}/agent/v1/chat/completions", json={"model": "agent-llm", "messages": []})
    assert no_key.status_code == 401


BODY = {"model": "agent-llm", "messages": [{"role": "user", "content": "Tell me about research."}], "max_tokens": 8}


async def _fire(url: str, key: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        return await asyncio.gather(*(client.post("/agent/v1/chat/completions", json=BODY, headers=bearer(key))
                                      for _ in range(n)))


def _budget_fails_closed(make_gym: Any, standin: Any, store: Store | None, teacher_secret: str) -> None:
    # Prompts free and every max_tokens generated: a call costs exactly its reservation, so an
    # agent budget of 20 reservations admits exactly 20 of 200 concurrent calls.
    gym = make_gym(store, config=agent_config(standin[0], input_price=0.0))
    per_call = estimate_agent_chat(BODY, gym.gateway.context)
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        key = _run_key(client, budget=1.0, agent_budget=20 * per_call / 1e9)
        served_before = len(standin[1].state.requests)
        responses = asyncio.run(_fire(url, key["key"], 200))
        assert Counter(r.status_code for r in responses) == {200: 20, 402: 180}
        assert {r.json()["error"]["type"] for r in responses if r.status_code == 402} == {"budget_exhausted"}
        assert len(standin[1].state.requests) - served_before == 20  # refused calls never reached the provider
        claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as refused:
            claude.messages.create(model="agent-llm", max_tokens=8, messages=[{"role": "user", "content": QUESTION}])
        assert refused.value.status_code == 402
        body: Any = refused.value.body
        assert body["type"] == "error" and body["error"]["type"] == "budget_exhausted"
        balance = _balance(client, key["key"])
        meter = balance["agent_model"]
        assert meter["spent_usd"] <= meter["budget_usd"] and meter["reserved_usd"] == 0
        assert meter["spent_usd"] == pytest.approx(20 * per_call / 1e9)
        assert balance["spent_usd"] == 0 and balance["reserved_usd"] == 0  # the service budget is apart
        assert len(_trajectory(client, key["id"])) == 20
        everything = " ".join(r.text for r in responses)
        assert teacher_secret not in everything
    with gym.gateway.store.transaction() as s:
        meter_rows = s.scalars(select(LedgerEntry).where(LedgerEntry.key_id == key["agent_meter_id"])).all()
        assert len(meter_rows) == 20 and {r.status for r in meter_rows} == {"settled"}  # nothing left reserved
        assert sum(r.actual_nusd or 0 for r in meter_rows) == 20 * per_call
        assert not s.scalars(select(LedgerEntry).where(LedgerEntry.key_id == key["id"])).all()
        assert len(s.scalars(select(AgentTurn).where(AgentTurn.run_id == key["id"])).all()) == 20


def test_agent_budget_fails_closed_on_sqlite(make_gym: Any, standin: Any, teacher_secret: str) -> None:
    _budget_fails_closed(make_gym, standin, None, teacher_secret)


def test_agent_budget_fails_closed_on_postgres(make_gym: Any, standin: Any, pg_schema: str,
                                               teacher_secret: str) -> None:
    store = Store(PG_URL, StoreSettings(), schema=pg_schema)
    store.migrate()
    try:
        _budget_fails_closed(make_gym, standin, store, teacher_secret)
    finally:
        store.dispose()


# -- the agent route's token rate (policy services.agent.tokens_per_minute) ---------------------

ROLLOUT_CHAT = {"model": "teacher", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8}


def _meter_rows(gym: Any, meter_id: str) -> list[LedgerEntry]:
    with gym.gateway.store.transaction() as s:
        return list(s.scalars(select(LedgerEntry).where(LedgerEntry.key_id == meter_id)).all())


def test_agent_token_rate_refuses_both_sdks_uncharged_and_leaves_rollout_alone(
        make_gym: Any, standin: Any, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    gym = make_gym(store, config=agent_config(standin[0]))
    ctx = gym.gateway.context
    chat = {"model": "agent-llm", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16}
    per_call = estimate_agent_chat_tokens(chat, ctx)
    agent_limit = 2 * per_call + per_call // 2  # two chat calls fit, a third does not
    rollout_per_call = estimate_chat_tokens(ROLLOUT_CHAT, ctx)
    minute = datetime(2026, 12, 1, 12, 0, 20, tzinfo=UTC)  # the whole test in one minute, 40 s before the next
    monkeypatch.setattr(rate_limits, "utcnow", lambda: minute)
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        # The rollout limit admits exactly one rollout call: were the agent's tokens counted on the
        # same counter (one per key, as before), that call would be refused.
        created = client.post("/admin/v1/keys", headers=admin_headers(), json={
            "budget_usd": 1.0, "agent_budget_usd": 1.0, "policy": {"services": {
                "rollout": {"tokens_per_minute": rollout_per_call},
                "agent": {"tokens_per_minute": agent_limit}}}})
        assert created.status_code == 201, created.text
        key = created.json()
        served_before = len(standin[1].state.requests)
        oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key["key"], max_retries=0)
        ok = [oai.chat.completions.with_raw_response.create(**chat) for _ in range(2)]
        assert [r.parse().choices[0].message.content for r in ok] == ["5", "5"]
        spent = _balance(client, key["key"])["agent_model"]

        with pytest.raises(openai.RateLimitError) as limited:
            oai.chat.completions.create(**chat)
        assert limited.value.status_code == 429 and limited.value.response.headers["Retry-After"] == "40"
        body: Any = limited.value.body
        assert body["type"] == "rate_limited" and "agent" in body["message"]  # the SDK's body is the error object
        assert limited.value.response.json()["request_id"].startswith("req_")
        claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as limited_messages:
            claude.messages.create(model="agent-llm", max_tokens=per_call,
                                   messages=[{"role": "user", "content": QUESTION}])
        assert limited_messages.value.response.json()["error"]["type"] == "rate_limited"
        with pytest.raises(anthropic.RateLimitError):  # the stream is refused before it opens
            with claude.messages.stream(model="agent-llm", max_tokens=per_call,
                                        messages=[{"role": "user", "content": QUESTION}]) as stream:
                list(stream)

        # Refused calls reached no provider, charged nothing, held nothing, left no turn.
        assert len(standin[1].state.requests) - served_before == 2
        after = _balance(client, key["key"])
        assert after["agent_model"] == spent and after["agent_model"]["reserved_usd"] == 0
        rows = _meter_rows(gym, key["agent_meter_id"])
        assert len(rows) == 2 and {r.status for r in rows} == {"settled"}
        assert len(_trajectory(client, key["id"])) == 2
        events = client.get(f"/admin/v1/runs/{key['id']}/events", headers=admin_headers()).json()["data"]
        refused = [e["data"] for e in events if e["kind"] == CALL_REFUSED]
        assert [(r["service"], r["status"], r["error"]) for r in refused] == [("agent", 429, "rate_limited")] * 3

        # The rollout rate is its own: its one call this minute still passes, the next is refused.
        assert client.post("/rollout/v1/chat/completions", json=ROLLOUT_CHAT, headers=bearer(key["key"])).status_code == 200
        second = client.post("/rollout/v1/chat/completions", json=ROLLOUT_CHAT, headers=bearer(key["key"]))
        assert second.status_code == 429 and "rollout" in second.json()["error"]["message"]
        assert after["spent_usd"] == 0  # nothing of the agent's on the service budget
    assert rate_limits.used_tokens(gym.gateway.store, key["id"], "agent", now=minute) == 2 * per_call
    assert rate_limits.used_tokens(gym.gateway.store, key["id"], "rollout", now=minute) == rollout_per_call


def test_a_child_key_is_limited_by_the_run_keys_agent_rate(live: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url, client, _ = live
    minute = datetime(2026, 12, 1, 12, 0, 5, tzinfo=UTC)
    monkeypatch.setattr(rate_limits, "utcnow", lambda: minute)
    chat = {"model": "agent-llm", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8}
    run = client.post("/admin/v1/keys", headers=admin_headers(), json={
        "budget_usd": 1.0, "agent_budget_usd": 1.0, "policy": {"services": {"agent": {"tokens_per_minute": 1000}}}})
    assert run.status_code == 201, run.text
    run_key = run.json()["key"]
    wider = client.post("/v1/keys", headers=bearer(run_key),
                        json={"policy": {"services": {"agent": {"tokens_per_minute": 5000}}}})
    assert wider.status_code == 403 and wider.json()["error"]["param"] == "services.agent.tokens_per_minute"
    child = client.post("/v1/keys", headers=bearer(run_key), json={"name": "worker"}).json()
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=child["key"], max_retries=0)
    served = 0
    with pytest.raises(openai.RateLimitError):  # the run key's limit counts every child's calls
        for _ in range(100):
            oai.chat.completions.create(**chat)
            served += 1
    assert 0 < served < 100
    assert _balance(client, run_key)["agent_model"]["reserved_usd"] == 0


# -- /agent/v1/messages/count_tokens ------------------------------------------------------------


def test_count_tokens_with_the_anthropic_sdk_is_free_and_counts_like_the_reservation(
        make_gym: Any, standin: Any) -> None:
    gym = make_gym(config=agent_config(standin[0]))
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        _count_tokens(url, client, _run_key(client), gym.gateway.context, standin)


def _count_tokens(url: str, client: httpx.Client, key: dict[str, Any], gym_context: Any, standin: Any) -> None:
    claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
    tools: Any = [{"name": "calc", "description": "add", "input_schema": {"type": "object", "properties": {}}}]
    ask: Any = {"model": "agent-llm", "system": "Answer with the number only.", "tools": tools,
                "messages": [{"role": "user", "content": QUESTION}]}
    served_before = len(standin[1].state.requests)
    counted = claude.messages.count_tokens(**ask)
    # The route's own counting: a Messages call's reservation is this bound plus its max_tokens.
    assert counted.input_tokens == estimate_agent_messages_tokens({**ask, "max_tokens": 8}, gym_context) - 8
    short, long = (claude.messages.count_tokens(model="agent-llm", messages=[{"role": "user", "content": text}])
                   .input_tokens for text in (QUESTION, QUESTION * 50))
    assert short < counted.input_tokens and long >= short + 49 * len(QUESTION)  # the prompt's bytes bound it
    assert len(standin[1].state.requests) == served_before  # no provider was asked
    balance = _balance(client, key["key"])
    assert balance["agent_model"]["spent_usd"] == 0 and balance["agent_model"]["reserved_usd"] == 0
    assert balance["spent_usd"] == 0
    assert _meter_rows_of(client, key) == [] and _trajectory(client, key["id"]) == []

    # A bound: never below what the provider bills for the same prompt.
    message = claude.messages.create(max_tokens=8, **ask)
    assert 0 < message.usage.input_tokens <= counted.input_tokens

    for model in ("teacher", "gpt-4o"):  # outside the agent catalogue
        with pytest.raises(anthropic.PermissionDeniedError):
            claude.messages.count_tokens(model=model, messages=[{"role": "user", "content": QUESTION}])
    with pytest.raises(anthropic.UnprocessableEntityError):
        claude.messages.count_tokens(model="agent-llm", messages=[{"role": "user", "content": QUESTION}],
                                     extra_body={"temperature": 0.5})
    with pytest.raises(anthropic.PermissionDeniedError):  # a server tool is refused as on /messages
        claude.messages.count_tokens(model="agent-llm", messages=[{"role": "user", "content": QUESTION}],
                                     tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert httpx.post(f"{url}/agent/v1/messages/count_tokens", json=ask).status_code == 401


def _meter_rows_of(client: httpx.Client, key: dict[str, Any]) -> list[Any]:
    r = client.get(f"/admin/v1/keys/{key['agent_meter_id']}/ledger", headers=admin_headers())
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def test_count_tokens_refused_for_a_revoked_key_an_ended_run_and_a_run_without_meter(live: Any) -> None:
    url, client, key = live
    ask: Any = {"model": "agent-llm", "messages": [{"role": "user", "content": QUESTION}]}
    child = client.post("/v1/keys", json={"name": "worker"}, headers=bearer(key["key"])).json()
    worker = anthropic.Anthropic(base_url=f"{url}/agent", api_key=child["key"], max_retries=0)
    assert worker.messages.count_tokens(**ask).input_tokens > 0
    assert client.post(f"/v1/keys/{child['id']}/revoke", headers=bearer(key["key"])).status_code == 200
    with pytest.raises(anthropic.AuthenticationError):
        worker.messages.count_tokens(**ask)

    bare = _run_key(client, agent_budget=None)
    with pytest.raises(anthropic.PermissionDeniedError) as no_meter:
        anthropic.Anthropic(base_url=f"{url}/agent", api_key=bare["key"], max_retries=0).messages.count_tokens(**ask)
    assert "agent-model budget" in str(no_meter.value)

    ended = client.post(f"/admin/v1/keys/{key['id']}/deadline", json={"deadline_s": -1}, headers=admin_headers())
    assert ended.status_code == 200, ended.text
    claude = anthropic.Anthropic(base_url=f"{url}/agent", api_key=key["key"], max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as after:
        claude.messages.count_tokens(**ask)
    assert after.value.response.json()["error"]["type"] == "run_ended"


def test_cli_keys_create_takes_the_agent_rate_from_the_policy_file(live: Any, tmp_path: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``rsigym keys create`` takes token rates where it takes the rollout one: the policy file."""
    from typer.testing import CliRunner

    from ops.cli import keys
    from ops.cli import main as cli

    url, client, _ = live

    def call(method: str, path: str, data_dir: Any, url_: Any, **kw: Any) -> Any:
        r = client.request(method, path, headers=admin_headers(), **kw)
        assert r.status_code == 201, r.text
        return r.json()

    monkeypatch.setattr(keys, "admin_request", call)
    policy = tmp_path / "policy.toml"
    policy.write_text("[services.rollout]\ntokens_per_minute = 5000\n[services.agent]\ntokens_per_minute = 1\n")
    out = CliRunner().invoke(cli.app, ["keys", "create", "--policy-file", str(policy), "--budget", "1",
                                       "--agent-budget", "1", "--json"])
    assert out.exit_code == 0, out.output
    made = json.loads(out.output)
    shown = client.get(f"/admin/v1/keys/{made['id']}", headers=admin_headers()).json()
    assert shown["policy"]["services"]["agent"]["tokens_per_minute"] == 1
    oai = openai.OpenAI(base_url=f"{url}/agent/v1", api_key=made["key"], max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError):  # one call above the whole limit can never pass
        oai.chat.completions.create(model="agent-llm", messages=[{"role": "user", "content": QUESTION}], max_tokens=8)


def test_the_offline_default_config_serves_an_agent_model(make_gym: Any) -> None:
    """A plain `rsigym up` (kit/offline_gym.toml): the agent route lists a model and answers on it
    (the stand-in), so an agent that thinks there (`--agent dag`) runs with no provider key."""
    gym = make_gym(config=load_config(None))
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        key = _run_key(client)
        listed = client.get("/agent/v1/models", headers=bearer(key["key"]))
        assert listed.status_code == 200, listed.text
        names = [m["id"] for m in listed.json()["data"]]
        assert names == ["agent"]
        r = client.post("/agent/v1/chat/completions", headers=bearer(key["key"]),
                        json={"model": names[0], "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "5"
