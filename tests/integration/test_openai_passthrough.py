"""OpenAI-compatible models go straight to their provider, not through LiteLLM
(services/rollout/backends/openai_compatible.py), and nothing else changes for it: the platform's
key is sent to the provider and nowhere else, the agent's key never leaves the gym, a provider's
errors reach the agent as the LiteLLM path maps them and cost nothing, a stream cut off before
``[DONE]`` costs its reservation, and ``[rollout] openai_passthrough = false`` puts every model
back on LiteLLM."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import TEACHER_ENV, admin_headers, bearer, client_for, create_key, gym_config
from tests.fakes.servers import serve


def chat(client: httpx.Client, key: str, model: str = "teacher", **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "What is 12 + 30?"}], "max_tokens": 8, **extra}
    return client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key))


def ledger(client: httpx.Client, key_id: str) -> list[dict[str, Any]]:
    return client.get(f"/admin/v1/keys/{key_id}/ledger", headers=admin_headers()).json()["data"]


@pytest.fixture
def litellm_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every call that reaches ``litellm.acompletion`` (which then proceeds as usual)."""
    import litellm

    calls: list[dict[str, Any]] = []
    real = litellm.acompletion

    async def spy(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return await real(**kwargs)

    monkeypatch.setattr(litellm, "acompletion", spy)
    return calls


def test_an_openai_compatible_model_is_called_without_litellm(make_gym: Any, litellm_calls: list[Any]) -> None:
    client = client_for(make_gym())
    run = create_key(client, 1.0)
    answered = chat(client, run["key"])
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "42"
    assert answered.json()["usage"]["cost_usd"] > 0
    with client.stream("POST", "/rollout/v1/chat/completions", headers=bearer(run["key"]),
                       json={"model": "teacher", "messages": [{"role": "user", "content": "Describe research."}],
                             "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}) as r:
        streamed = r.read().decode()
    assert r.status_code == 200 and '"completion_tokens":6' in streamed and streamed.endswith("data: [DONE]\n\n")
    assert litellm_calls == []
    assert [row["status"] for row in ledger(client, run["id"])] == ["settled", "settled"]


def test_with_the_passthrough_off_litellm_calls_the_provider(make_gym: Any, standin: Any,
                                                              litellm_calls: list[Any]) -> None:
    client = client_for(make_gym(config=gym_config(standin[0], openai_passthrough=False)))
    run = create_key(client, 1.0)
    answered = chat(client, run["key"])
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"] == "42"
    assert [c["model"] for c in litellm_calls] == ["openai/teacher"]


# -- a provider that misbehaves, one model per way ----------------------------------------

FAILURES = {
    "limited": (429, {"error": {"message": "slow down", "type": "rate_limit"}}),
    "denied": (401, {"error": {"message": "bad key sk-leaked-by-provider", "type": "auth"}}),
    "refused": (400, {"error": {"message": "messages too long for this model", "type": "invalid_request_error"}}),
    "crashed": (500, {"error": {"message": "internal", "type": "server_error"}}),
}


class MisbehavingProvider:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.seen.append({"headers": dict(request.headers), "body": body})
        model = body["model"]
        if model in FAILURES:
            status, payload = FAILURES[model]
            return JSONResponse(payload, status_code=status)
        if model == "echoing":  # a provider that quotes the credential it was sent back in its error
            message = f"invalid request with {request.headers.get('authorization')}"
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=400)
        if model == "garbled":
            return Response(b"<html>gateway error</html>", status_code=200, media_type="text/html")

        async def cut_off() -> Iterator[bytes]:  # type: ignore[misc]
            chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "4"}}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()  # then the connection ends: no usage, no [DONE]

        return StreamingResponse(cut_off(), media_type="text/event-stream")


@pytest.fixture
def misbehaving(make_gym: Any, teacher_secret: str) -> Iterator[tuple[httpx.Client, MisbehavingProvider]]:
    provider = MisbehavingProvider()
    with serve(provider.app) as url:
        models = [{"name": name, "litellm_model": f"openai/{name}", "api_base": url + "/v1", "api_key_env": TEACHER_ENV,
                   "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
                  for name in (*FAILURES, "garbled", "cutoff", "echoing")]
        config = gym_config(url + "/v1").model_copy(deep=True)
        config.rollout.models = [type(config.rollout.models[0]).model_validate(m) for m in models]
        yield client_for(make_gym(config=config)), provider


def test_provider_errors_are_mapped_unbilled_and_keys_stay_where_they_belong(
        misbehaving: tuple[httpx.Client, MisbehavingProvider], teacher_secret: str) -> None:
    client, provider = misbehaving
    run = create_key(client, 1.0)
    expected = {"limited": (429, "rate_limited", "the provider is rate limiting"),
                "denied": (502, "upstream_error", "the provider refused the platform's credentials"),
                "refused": (422, "invalid_request_error", "messages too long for this model"),
                "crashed": (502, "upstream_error", "the provider failed"),
                "garbled": (502, "upstream_error", "the provider failed")}
    for model, (status, kind, says) in expected.items():
        r = chat(client, run["key"], model)
        assert r.status_code == status, (model, r.text)
        error = r.json()["error"]
        assert error["type"] == kind and says in error["message"] and "Not billed." in error["message"], error
        assert "sk-leaked-by-provider" not in r.text
    assert chat(client, run["key"], "limited").headers.get("retry-after") == "5"
    rows = ledger(client, run["id"])
    assert rows and {row["status"] for row in rows} == {"released"}
    assert client.get(f"/admin/v1/keys/{run['id']}", headers=admin_headers()).json()["spent_usd"] == 0

    # What the provider received: the platform's key, the upstream model name, one attempt per call.
    assert len(provider.seen) == len(expected) + 1
    for seen in provider.seen:
        assert seen["headers"]["authorization"] == f"Bearer {teacher_secret}"
        assert run["key"] not in json.dumps(seen)
    assert [s["body"]["model"] for s in provider.seen[:len(expected)]] == list(expected)


def test_a_provider_that_echoes_the_platform_key_shows_it_to_nobody(
        misbehaving: tuple[httpx.Client, MisbehavingProvider], teacher_secret: str,
        caplog: pytest.LogCaptureFixture) -> None:
    client, provider = misbehaving
    run = create_key(client, 1.0)
    with caplog.at_level("INFO"):
        r = chat(client, run["key"], "echoing")
    assert r.status_code == 422 and "invalid request with Bearer [redacted]" in r.json()["error"]["message"]
    assert provider.seen[-1]["headers"]["authorization"] == f"Bearer {teacher_secret}"  # it did get the key
    assert teacher_secret not in r.text and teacher_secret not in caplog.text
    assert "Bearer [redacted]" in caplog.text  # the operator's line has the detail, scrubbed


def test_a_stream_cut_off_before_done_costs_its_reservation(
        misbehaving: tuple[httpx.Client, MisbehavingProvider]) -> None:
    client, _provider = misbehaving
    run = create_key(client, 1.0)
    with client.stream("POST", "/rollout/v1/chat/completions", headers=bearer(run["key"]),
                       json={"model": "cutoff", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                             "max_tokens": 8, "stream": True}) as r:
        streamed = r.read().decode()
        reserved = float(r.headers["x-rsigym-cost-usd"])
    assert '"content":"4"' in streamed
    assert "the stream broke off" in streamed and "[DONE]" in streamed
    [row] = ledger(client, run["id"])
    assert row["status"] == "settled" and row["actual_usd"] == pytest.approx(reserved) and reserved > 0
