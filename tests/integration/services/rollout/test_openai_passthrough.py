"""OpenAI-compatible models go straight to their provider, not through LiteLLM
(services/rollout/backends/openai_compatible.py), and nothing else changes for it: the platform's
key is sent to the provider and nowhere else, the agent's key never leaves the gym, a provider's
errors reach the agent as the LiteLLM path maps them and cost nothing, a stream cut off before
``[DONE]`` costs its reservation, and ``[rollout] openai_passthrough = false`` puts every model
back on LiteLLM."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
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


def stream_chat(client: httpx.Client, key: str, model: str, question: str) -> tuple[httpx.Response, str]:
    """A streamed chat call read to its end: the response and its body."""
    with client.stream("POST", "/rollout/v1/chat/completions", headers=bearer(key),
                       json={"model": model, "messages": [{"role": "user", "content": question}],
                             "max_tokens": 8, "stream": True}) as r:
        return r, r.read().decode()


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
    def __init__(self, elsewhere: str = "") -> None:
        self.seen: list[dict[str, Any]] = []
        self.elsewhere = elsewhere
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
        if model == "redirecting":  # somewhere else would like the platform's key
            return Response(status_code=307, headers={"location": self.elsewhere + "/v1/chat/completions"})
        if model == "slow":
            await asyncio.sleep(3)
            return JSONResponse({"choices": []})
        if model == "crlf":  # CRLF line ends, each event split across writes mid-line
            return StreamingResponse(self._crlf_stream(model), media_type="text/event-stream")

        async def cut_off() -> Iterator[bytes]:  # type: ignore[misc]
            chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "4"}}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()  # then the connection ends: no usage, no [DONE]

        return StreamingResponse(cut_off(), media_type="text/event-stream")


    @staticmethod
    async def _crlf_stream(model: str) -> AsyncIterator[bytes]:
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        events = [{"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": piece}}]} for piece in ("4", "2")]
        events.append({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [],
                       "usage": usage})
        for line in [f"data: {json.dumps(e)}\r\n\r\n" for e in events] + ["data: [DONE]\r\n\r\n"]:
            half = len(line) // 2
            yield line[:half].encode()
            await asyncio.sleep(0.01)
            yield line[half:].encode()


class Elsewhere:
    """Where a redirecting provider points: records whatever reaches it."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["GET", "POST"])])

    async def chat(self, request: Request) -> Response:
        self.seen.append(dict(request.headers))
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}}]})


MISBEHAVING_MODELS = (*FAILURES, "garbled", "cutoff", "echoing", "redirecting", "slow", "crlf")


@pytest.fixture
def misbehaving(make_gym: Any, teacher_secret: str,
                elsewhere: Elsewhere) -> Iterator[tuple[httpx.Client, MisbehavingProvider]]:
    with serve(elsewhere.app) as other:
        provider = MisbehavingProvider(other)
        with serve(provider.app) as url:
            models = [{"name": name, "litellm_model": f"openai/{name}", "api_base": url + "/v1",
                       "api_key_env": TEACHER_ENV, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
                      for name in MISBEHAVING_MODELS]
            config = gym_config(url + "/v1").model_copy(deep=True)
            config.rollout.models = [type(config.rollout.models[0]).model_validate(m) for m in models]
            config.rollout.request_timeout_s = 1.0
            yield client_for(make_gym(config=config)), provider


@pytest.fixture
def elsewhere() -> Elsewhere:
    return Elsewhere()


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
    r, streamed = stream_chat(client, run["key"], "cutoff", "What is 2 + 2?")
    reserved = float(r.headers["x-rsigym-cost-usd"])
    assert '"content":"4"' in streamed
    assert "the stream broke off" in streamed and "[DONE]" in streamed
    [row] = ledger(client, run["id"])
    assert row["status"] == "settled" and row["actual_usd"] == pytest.approx(reserved) and reserved > 0


def test_a_redirect_is_not_followed_and_the_key_goes_nowhere_else(
        misbehaving: tuple[httpx.Client, MisbehavingProvider], elsewhere: Elsewhere, teacher_secret: str) -> None:
    """A provider's answer is its answer: a 307 elsewhere is an upstream error, unbilled, and the
    place it points to never hears of the call, let alone the platform's key."""
    client, provider = misbehaving
    run = create_key(client, 1.0)
    r = chat(client, run["key"], "redirecting")
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error", r.text
    assert elsewhere.seen == []
    assert provider.seen[-1]["headers"]["authorization"] == f"Bearer {teacher_secret}"
    assert [row["status"] for row in ledger(client, run["id"])] == ["released"]


def test_a_provider_slower_than_the_request_timeout_is_a_timeout_that_costs_its_reservation(
        misbehaving: tuple[httpx.Client, MisbehavingProvider]) -> None:
    """As on the LiteLLM path: the provider had the request and may have generated (and billed)
    it, so the call costs its reservation (services/rollout/service.py: _BILLED_FAILURES)."""
    client, _provider = misbehaving
    run = create_key(client, 1.0)
    r = chat(client, run["key"], "slow")  # request_timeout_s = 1; the provider takes 3 s
    assert r.status_code == 504 and "did not answer in time" in r.json()["error"]["message"], r.text
    [row] = ledger(client, run["id"])
    assert row["status"] == "settled" and row["actual_usd"] == row["estimate_usd"] > 0


def test_a_stream_with_crlf_lines_split_across_writes_is_relayed_whole_and_billed_by_its_usage(
        misbehaving: tuple[httpx.Client, MisbehavingProvider]) -> None:
    client, _provider = misbehaving
    run = create_key(client, 1.0)
    r, streamed = stream_chat(client, run["key"], "crlf", "What is 40 + 2?")
    assert r.status_code == 200, streamed
    contents = [json.loads(line[6:])["choices"][0]["delta"].get("content")
                for line in streamed.split("\n") if line.startswith("data: {") and '"choices":[{' in line]
    assert "".join(c for c in contents if c) == "42"
    assert streamed.endswith("data: [DONE]\n\n")
    [row] = ledger(client, run["id"])
    assert row["status"] == "settled" and row["actual_usd"] == pytest.approx(5 * 1.0e-6 + 2 * 2.0e-6)


def test_a_provider_session_is_closed_with_its_event_loop_or_when_the_gym_stops(make_gym: Any) -> None:
    """Each event loop has its own pool of provider connections: one whose loop ends (a test client
    runs each request on a loop of its own) is closed by that loop's shutdown; one whose loop still
    runs is closed by the rollout service's close hook. No connection is left open to be reaped by GC."""
    from fastapi.testclient import TestClient

    gym = make_gym()
    rollout = gym.service_apps["rollout"]
    backend = rollout.state.rollout.backend.direct
    client = client_for(gym)  # no `with`: a loop per request
    run = create_key(client, 1.0)
    assert chat(client, run["key"]).status_code == 200
    [(_loop, ended)] = backend._direct.items()
    assert ended.closed and ended.opened == 1
    with TestClient(gym.app, base_url="http://gym") as lasting:  # one loop for all its requests
        assert chat(lasting, run["key"]).status_code == 200
        assert chat(lasting, run["key"]).status_code == 200
        live = [pool for _loop, pool in backend._direct.items() if not pool.closed]
        assert len(live) == 1 and live[0].opened == 1  # the second call took the first's connection
        [[kept]] = live[0]._idle.values()
        rollout.state.close()
        assert live[0].closed and kept.closed and kept.transport.is_closing()
    assert backend._providers.items() == []  # no proxy named: aiohttp never opened a session


class RecordingProvider:
    """A provider that answers every chat completion with "42" and its usage, and records the
    headers each call came with (the host it was addressed to among them)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        self.seen.append(dict(request.headers))
        return JSONResponse({"id": "c1", "object": "chat.completion", "created": 1, "model": "teacher",
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "42"}}],
                             "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})


def test_a_netrc_entry_for_the_providers_host_changes_nothing(
        make_gym: Any, teacher_secret: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A netrc file that names the provider's host is not the provider's credential: the call goes
    with the platform key alone (aiohttp's trust_env refused such a call outright, netrc auth
    beside an Authorization header), and the netrc password is sent nowhere."""
    provider = RecordingProvider()
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password netrc-secret-123\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    with serve(provider.app) as url:
        client = client_for(make_gym(config=gym_config(url + "/v1")))
        run = create_key(client, 1.0)
        r = chat(client, run["key"])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "42"
    assert [h["authorization"] for h in provider.seen] == [f"Bearer {teacher_secret}"]
    assert "netrc-secret-123" not in json.dumps(provider.seen)
    assert [row["status"] for row in ledger(client, run["id"])] == ["settled"]


def test_the_provider_is_called_through_the_proxy_the_environment_names(
        make_gym: Any, teacher_secret: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``HTTP_PROXY`` applies to the provider's calls (a host only the proxy can reach answers
    through it), and ``NO_PROXY`` takes a host off it."""
    proxy = RecordingProvider()  # plays the proxy: it answers as the provider it would forward to
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with serve(proxy.app) as proxy_url:
        monkeypatch.setenv("http_proxy", proxy_url)
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        client = client_for(make_gym(config=gym_config("http://provider.invalid/v1")))
        run = create_key(client, 1.0)
        r = chat(client, run["key"])
        assert r.status_code == 200, r.text
        assert [(h["host"], h["authorization"]) for h in proxy.seen] == [("provider.invalid", f"Bearer {teacher_secret}")]

        monkeypatch.setenv("no_proxy", "provider.invalid")
        monkeypatch.setenv("NO_PROXY", "provider.invalid")
        bypassing = client_for(make_gym(config=gym_config("http://provider.invalid/v1")))
        run = create_key(bypassing, 1.0)
        r = chat(bypassing, run["key"])
        assert r.status_code == 502, r.text  # straight to a host that does not exist
        assert len(proxy.seen) == 1


@pytest.mark.parametrize("api_base", ["http://127.0.0.1:99999/v1", "ftp://127.0.0.1/v1"])
def test_a_provider_url_that_cannot_be_called_is_an_unbilled_upstream_error(make_gym: Any, api_base: str) -> None:
    """An ``api_base`` the client cannot send to (a port out of range, not http(s)) is the
    operator's mistake: the agent gets the standard upstream error, not a 500, and pays nothing."""
    client = client_for(make_gym(config=gym_config(api_base)))
    run = create_key(client, 1.0)
    r = chat(client, run["key"])
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error", r.text
    assert "99999" not in r.text and "ftp" not in r.text  # the provider's address is the operator's
    assert [row["status"] for row in ledger(client, run["id"])] == ["released"]

