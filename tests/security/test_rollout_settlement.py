"""Settlement cannot undercount: every cent a provider can bill is reserved, charged or
at least recorded.

The agent calls the rollout service through the gateway; the provider is the stand-in
(optionally wrapped in tests/fakes/provider_faults.py to overbill, answer too late or break
a stream off). What must hold:

* the reservation is an upper bound of what the provider bills, even for prompts the old
  token-counter estimate missed (structured-output schemas, tools);
* a provider that bills more than the reservation never drives the run past its budget, but
  the overrun is on the ledger row and in the gateway's metrics;
* a provider that timed out or broke a stream off after it had the request is billed the
  reservation — the gym cannot know what it generated — instead of being released.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.rollout.metering import estimate_chat
from services.rollout.standin import create_standin_app
from tests.conftest import admin_headers, bearer, create_key, gym_config
from tests.fakes.provider_faults import ProviderFaults
from tests.fakes.servers import serve, serve_gym

TEACHER_IN, TEACHER_OUT = 1.0, 2.0  # USD per million tokens (tests/conftest.py gym_config)


def _ledger(client: httpx.Client, key_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/admin/v1/keys/{key_id}/ledger", headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()["data"]


def _balance(client: httpx.Client, key: str) -> dict[str, Any]:
    return client.get("/v1/balance", headers=bearer(key)).json()


def _overrun_metric(client: httpx.Client, service: str = "rollout") -> float:
    text = client.get("/metrics", headers=admin_headers()).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "rsigym_provider_overrun_usd_total" and sample.labels.get("service") == service:
                return float(sample.value)
    return 0.0


def _provider_cost_usd(usage: dict[str, Any]) -> float:
    return (usage["prompt_tokens"] * TEACHER_IN + usage["completion_tokens"] * TEACHER_OUT) / 1e6


@pytest.fixture
def faulty_gym(make_gym: Any, teacher_secret: str) -> Iterator[Any]:
    """Builds a gym whose provider is the stand-in with the given faults; yields a factory."""
    opened: list[Any] = []

    def build(faults: dict[str, Any], **rollout: Any) -> tuple[str, httpx.Client, ProviderFaults, Any]:
        provider = ProviderFaults(create_standin_app(teacher_secret), **faults)
        provider_cm = serve(provider)
        opened.append(provider_cm)
        provider_url = provider_cm.__enter__()
        gym = make_gym(config=gym_config(provider_url + "/v1", **rollout))
        gym_cm = serve_gym(gym)
        opened.append(gym_cm)
        url = gym_cm.__enter__()
        client = httpx.Client(base_url=url, timeout=60)
        opened.append(client)
        return url, client, provider, gym

    yield build
    for thing in reversed(opened):
        thing.__exit__(None, None, None)


# -- (a) the reservation covers what the provider bills -------------------------------------


def _big_schema(fields: int) -> dict[str, Any]:
    props = {
        f"finding_{i}": {
            "type": "object",
            "description": f"Finding number {i}: what was measured, on which split, and how confident we are.",
            "properties": {
                "metric": {"type": "string", "enum": ["accuracy", "pass@1", "loss", "perplexity", "f1"]},
                "value": {"type": "number", "minimum": 0},
                "evidence": {"type": "string", "description": "Run ids and checkpoints that support the number."},
            },
            "required": ["metric", "value", "evidence"],
            "additionalProperties": False,
        }
        for i in range(fields)
    }
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _tools(count: int) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {
            "name": f"search_notes_{i}",
            "description": "Search the experiment notes of this run by free text; returns matching entries.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": "What to look for."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            }, "required": ["query"]},
        }}
        for i in range(count)
    ]


STRUCTURED_BODY = {
    "model": "teacher",
    "messages": [
        {"role": "system", "content": "You are a careful research assistant. Answer in the requested format."},
        {"role": "user", "content": "Summarise what we learned about LoRA rank on the dev split."},
    ],
    "tools": _tools(6),
    "tool_choice": "auto",
    "response_format": {"type": "json_schema", "json_schema": {"name": "report", "strict": True, "schema": _big_schema(40)}},
    "stop": ["\n\nEND"],
    "max_tokens": 16,
}


def test_reservation_covers_schema_and_tools_the_provider_bills(faulty_gym: Any) -> None:
    url, client, provider, gym = faulty_gym({})
    key = create_key(client, 1.0)
    r = client.post("/rollout/v1/chat/completions", json=STRUCTURED_BODY, headers=bearer(key["key"]))
    assert r.status_code == 200, r.text
    billed = provider.reported_usage[-1]
    assert r.json()["usage"]["prompt_tokens"] == billed["prompt_tokens"]
    sent = provider.state.requests[-1]
    assert sent["response_format"] == STRUCTURED_BODY["response_format"] and len(sent["tools"]) == 6
    assert not {"max_retries", "num_retries"} & set(sent)  # gym-side settings, never forwarded
    provider_cost = _provider_cost_usd(billed)
    [row] = _ledger(client, key["id"])
    assert row["status"] == "settled"
    assert row["estimate_usd"] >= provider_cost, (row, billed)
    # Within the bound, the run pays exactly what the provider billed, and nothing is overrun.
    assert row["actual_usd"] == pytest.approx(provider_cost)
    assert row["overrun_usd"] == 0
    assert float(r.headers["X-RSIGym-Cost-USD"]) == pytest.approx(provider_cost)


def test_reservation_bounds_every_choice_of_n(faulty_gym: Any) -> None:
    """With n choices the prompt may be billed once per choice: the bound covers n × (prompt + max_tokens)."""
    url, client, provider, gym = faulty_gym({})
    body = {"model": "teacher", "messages": [{"role": "user", "content": "Tell me about research."}], "max_tokens": 8}
    one = estimate_chat(body, gym.gateway.context)
    assert estimate_chat({**body, "n": 4}, gym.gateway.context) == 4 * one


def test_inline_images_reserve_the_models_image_bound_not_their_base64_size(faulty_gym: Any) -> None:
    url, client, provider, gym = faulty_gym({})
    teacher = gym.gateway.context.config.rollout.model("teacher")

    def body(image_bytes: int | None) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": "What is in this picture?"}]
        if image_bytes is not None:
            content.append({"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * image_bytes}})
        return {"model": "teacher", "messages": [{"role": "user", "content": content}], "max_tokens": 8}

    text_only = estimate_chat(body(None), gym.gateway.context)
    small, large = (estimate_chat(body(n), gym.gateway.context) for n in (1_000, 2_000_000))
    assert small == large  # a photo does not reserve a million tokens
    assert small - text_only >= teacher.max_image_tokens * TEACHER_IN * 1000  # nano-USD


# -- (b) a provider that bills more than the reservation -------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_provider_overrun_is_recorded_but_never_charged_past_the_budget(faulty_gym: Any, stream: bool) -> None:
    url, client, provider, gym = faulty_gym({"usage_factor": 50})
    body: dict[str, Any] = {"model": "teacher", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                            "max_tokens": 8}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    estimate = estimate_chat(body, gym.gateway.context)
    key = create_key(client, estimate / 1e9)  # the budget covers exactly one reservation
    before = _overrun_metric(client)
    r = client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key["key"]))
    assert r.status_code == 200, r.text
    billed = _provider_cost_usd(provider.reported_usage[-1])
    assert billed > estimate / 1e9  # the provider really did bill more than was held
    # The agent is told what it was charged (the reservation), not the provider's bill.
    if stream:
        usage = next(json.loads(line[6:])["usage"] for line in r.text.splitlines() if '"usage"' in line)
    else:
        usage = r.json()["usage"]
        assert float(r.headers["X-RSIGym-Cost-USD"]) == pytest.approx(estimate / 1e9)
    assert usage["cost_usd"] == pytest.approx(estimate / 1e9)

    balance = _balance(client, key["key"])
    assert balance["spent_usd"] <= balance["budget_usd"]
    assert balance["spent_usd"] == pytest.approx(estimate / 1e9) and balance["reserved_usd"] == 0
    [row] = _ledger(client, key["id"])
    assert row["status"] == "settled"
    assert row["actual_usd"] == pytest.approx(estimate / 1e9)
    assert row["overrun_usd"] == pytest.approx(billed - estimate / 1e9)
    assert _overrun_metric(client) - before == pytest.approx(billed - estimate / 1e9)


# -- (c) a provider that had the request but did not finish -----------------------------------


def _assert_billed_its_reservation(client: httpx.Client, key: dict[str, Any], estimate: int) -> None:
    [row] = _ledger(client, key["id"])
    assert row["status"] == "settled", row
    assert row["actual_usd"] == pytest.approx(estimate / 1e9) == row["estimate_usd"]
    balance = _balance(client, key["key"])
    assert balance["reserved_usd"] == 0
    assert balance["spent_usd"] == pytest.approx(estimate / 1e9)


@pytest.mark.parametrize("stream", [False, True])
def test_provider_timeout_is_billed_its_reservation(faulty_gym: Any, stream: bool) -> None:
    url, client, provider, gym = faulty_gym({"delay_s": 2.5}, request_timeout_s=0.5)
    key = create_key(client, 1.0)
    body = {"model": "teacher", "messages": [{"role": "user", "content": "What is 3 + 4?"}], "max_tokens": 8,
            "stream": stream}
    estimate = estimate_chat(body, gym.gateway.context)
    r = client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key["key"]))
    assert r.status_code == 504, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "upstream_timeout"
    message = error["error"]["message"]  # which model, and what it cost
    assert "'teacher'" in message and f"Billed ${estimate / 1e9:.6f}" in message, message
    assert "x-rsigym-internal-cost-nusd" not in r.headers  # the service's report stays inside the gym
    assert float(r.headers["X-RSIGym-Cost-USD"]) == pytest.approx(estimate / 1e9)
    assert provider.received == 1  # the call was not retried behind the reservation's back
    _assert_billed_its_reservation(client, key, estimate)


def test_stream_broken_off_by_the_provider_is_billed_its_reservation(faulty_gym: Any) -> None:
    url, client, provider, gym = faulty_gym({"break_after_chunks": 3})
    key = create_key(client, 1.0)
    body = {"model": "teacher", "messages": [{"role": "user", "content": "talk"}], "max_tokens": 64, "stream": True}
    estimate = estimate_chat(body, gym.gateway.context)
    with client.stream("POST", "/rollout/v1/chat/completions", json=body, headers=bearer(key["key"])) as r:
        text = r.read().decode()
    assert '"upstream_error"' in text and "rsigym-cost" not in text
    assert "'teacher'" in text and f"Billed ${estimate / 1e9:.6f}" in text, text
    _assert_billed_its_reservation(client, key, estimate)


def test_refusals_before_the_provider_stay_free(faulty_gym: Any) -> None:
    url, client, provider, gym = faulty_gym({})
    key = create_key(client, 1.0)
    for body, status in [
        ({"model": "teacher", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search"}]}, 403),
        ({"model": "nobody", "messages": [{"role": "user", "content": "x"}]}, 404),
        ({"model": "teacher", "messages": [{"role": "user", "content": "x"}], "n": 99}, 422),
    ]:
        r = client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key["key"]))
        assert r.status_code == status, r.text
    assert provider.received == 0
    assert all(row["status"] == "released" for row in _ledger(client, key["id"]))
    assert _balance(client, key["key"])["spent_usd"] == 0
