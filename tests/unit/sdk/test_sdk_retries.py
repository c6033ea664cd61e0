"""Retries: only refusals (429, 503) and requests that cannot have reached the server."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

import rsigym
from rsigym import _retry


def test_429_waits_retry_after_then_succeeds(gateway, sleeps, canned):
    gateway.route(
        "GET",
        "/v1/balance",
        gateway.error(429, "rate_limited", "slow down", headers={"Retry-After": "2"}),
        gateway.ok(canned["balance"]),
    )
    with gateway.gym() as gym:
        balance = gym.balance()
    assert balance.remaining_usd == 3.21
    assert len(gateway.calls("GET", "/v1/balance")) == 2
    assert sleeps == [2.0]


def test_post_refused_with_503_is_retried_because_no_work_was_done(gateway, sleeps, canned):
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.error(503, "store_unavailable", "ledger down", headers={"Retry-After": "1"}),
        gateway.ok(canned["completion"]),
    )
    with gateway.gym() as gym:
        completion = gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "hi"}])
    assert completion.text == "Hello there."
    assert len(gateway.requests) == 2
    assert sleeps == [1.0]


def test_503_gives_up_after_max_retries(gateway, sleeps):
    gateway.route("GET", "/v1/balance", gateway.error(503, "store_unavailable", "ledger down"))
    with gateway.gym(max_retries=3) as gym, pytest.raises(rsigym.ServiceUnavailableError):
        gym.balance()
    assert len(gateway.requests) == 4
    assert len(sleeps) == 3
    # exponential backoff with jitter when the server names no wait
    assert sleeps[0] < sleeps[1] < sleeps[2] <= _retry.MAX_DELAY
    assert 0.75 * _retry.INITIAL_DELAY <= sleeps[0] <= _retry.INITIAL_DELAY


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 409, 422, 500, 502])
def test_decisions_are_never_retried(gateway, sleeps, status):
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.error(status, "x", "no"))
    with gateway.gym(max_retries=5) as gym, pytest.raises(rsigym.APIStatusError) as info:
        gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == status
    assert len(gateway.requests) == 1
    assert sleeps == []


@pytest.mark.parametrize("max_retries", [0, 1, 3])
def test_connection_error_is_retried_max_retries_times(gateway, sleeps, max_retries):
    gateway.route("POST", "/v1/keys", httpx.ConnectError("refused"))
    with gateway.gym(max_retries=max_retries) as gym, pytest.raises(rsigym.APIConnectionError) as info:
        gym.keys.mint(name="child")
    assert type(info.value) is rsigym.APIConnectionError
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert len(gateway.requests) == max_retries + 1
    assert len(sleeps) == max_retries


def test_connection_error_then_success(gateway, sleeps, canned):
    gateway.route("GET", "/rollout/v1/models", httpx.ConnectError("refused"), gateway.ok(canned["models"]))
    with gateway.gym() as gym:
        assert [m.id for m in gym.rollout.models()] == ["teacher", "tiny-local"]
    assert len(sleeps) == 1


@pytest.mark.parametrize(
    "exc", [httpx.ReadTimeout("slow"), httpx.ReadError("reset"), httpx.RemoteProtocolError("closed")]
)
def test_post_that_may_have_run_upstream_is_not_retried(gateway, sleeps, exc):
    gateway.route("POST", "/rollout/v1/chat/completions", exc)
    with gateway.gym(max_retries=3) as gym, pytest.raises(rsigym.APIConnectionError):
        gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "hi"}])
    assert len(gateway.requests) == 1
    assert sleeps == []


def test_get_after_read_timeout_is_retried(gateway, sleeps, canned):
    gateway.route("GET", "/v1/balance", httpx.ReadTimeout("slow"), gateway.ok(canned["balance"]))
    with gateway.gym() as gym:
        assert gym.balance().budget_usd == 5.0
    assert len(gateway.requests) == 2


def test_retry_after_as_http_date(gateway, sleeps, canned):
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    gateway.route(
        "GET",
        "/v1/balance",
        gateway.error(429, "rate_limited", "later", headers={"Retry-After": when}),
        gateway.ok(canned["balance"]),
    )
    with gateway.gym() as gym:
        gym.balance()
    assert len(sleeps) == 1 and 25 <= sleeps[0] <= 30


def test_retry_after_longer_than_the_cap_raises_instead_of_waiting(gateway, sleeps):
    gateway.route(
        "GET", "/v1/balance", gateway.error(429, "rate_limited", "come back tomorrow", headers={"Retry-After": "86400"})
    )
    with gateway.gym() as gym, pytest.raises(rsigym.RateLimitError) as info:
        gym.balance()
    assert info.value.response.headers["Retry-After"] == "86400"
    assert len(gateway.requests) == 1
    assert sleeps == []


def test_every_attempt_is_a_fresh_authenticated_request(gateway, canned):
    gateway.route(
        "GET",
        "/v1/balance",
        gateway.error(429, "rate_limited", "x", headers={"Retry-After": "0"}),
        gateway.ok(canned["balance"]),
    )
    with gateway.gym() as gym:
        gym.balance()
    assert [r.headers["Authorization"] for r in gateway.requests] == ["Bearer rsg_test_key"] * 2


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "1.5"}, 1.5),
        ({"Retry-After": "0"}, 0.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"Retry-After": "soon"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers, expected):
    assert _retry.parse_retry_after(httpx.Headers(headers)) == expected


@pytest.mark.asyncio
async def test_async_429_retry_then_success(gateway, sleeps, canned):
    gateway.route(
        "GET",
        "/v1/balance",
        gateway.error(429, "rate_limited", "x", headers={"Retry-After": "3"}),
        gateway.ok(canned["balance"], request_id="req_2"),
    )
    async with gateway.async_gym() as gym:
        balance = await gym.balance()
    assert balance.request_id == "req_2"
    assert sleeps == [3.0]


@pytest.mark.asyncio
async def test_async_402_is_not_retried(gateway, sleeps):
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.error(402, "budget_exhausted", "broke"))
    async with gateway.async_gym(max_retries=4) as gym:
        with pytest.raises(rsigym.BudgetExhaustedError):
            await gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "hi"}])
    assert len(gateway.requests) == 1
    assert sleeps == []


@pytest.mark.asyncio
async def test_async_connection_error_retried_then_raised(gateway, sleeps):
    gateway.route("GET", "/v1/keys", httpx.ConnectError("refused"))
    async with gateway.async_gym(max_retries=2) as gym:
        with pytest.raises(rsigym.APIConnectionError):
            await gym.keys.list()
    assert len(gateway.requests) == 3
    assert len(sleeps) == 2
