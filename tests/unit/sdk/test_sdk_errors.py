"""Every error status becomes its own exception class carrying the server's error fields."""

from __future__ import annotations

import httpx
import pytest

import rsigym
from rsigym import errors

# The gateway's error vocabulary (kit/errors.py): several types share a status.
STATUS_CLASSES = [
    (400, rsigym.BadRequestError, "invalid_request_error"),
    (401, rsigym.AuthenticationError, "authentication_error"),
    (401, rsigym.AuthenticationError, "key_revoked"),
    (402, rsigym.BudgetExhaustedError, "budget_exhausted"),
    (403, rsigym.PermissionDeniedError, "permission_denied"),
    (403, rsigym.PermissionDeniedError, "key_paused"),
    (404, rsigym.NotFoundError, "not_found"),
    (409, rsigym.ConflictError, "conflict"),
    (422, rsigym.UnprocessableEntityError, "invalid_request_error"),
    (429, rsigym.RateLimitError, "concurrency_limit"),
    (429, rsigym.RateLimitError, "rate_limited"),
    (503, rsigym.ServiceUnavailableError, "store_unavailable"),
    (500, rsigym.InternalServerError, "internal_error"),
    (502, rsigym.InternalServerError, "upstream_error"),
    (504, rsigym.InternalServerError, "upstream_timeout"),
]


@pytest.mark.parametrize(("status", "cls", "type_"), STATUS_CLASSES)
def test_each_status_raises_its_class_with_the_body_fields(gateway, status, cls, type_):
    gateway.route(
        "GET",
        "/v1/balance",
        gateway.error(status, type_, f"msg {status}", param="budget_usd", request_id=f"req_{status}"),
    )
    with gateway.gym(max_retries=0) as gym, pytest.raises(cls) as info:
        gym.balance()
    err = info.value
    assert type(err) is cls
    assert isinstance(err, rsigym.APIStatusError) and isinstance(err, rsigym.RSIGymError)
    assert (err.status_code, err.type, err.message, err.param, err.request_id) == (
        status,
        type_,
        f"msg {status}",
        "budget_usd",
        f"req_{status}",
    )
    assert err.response is not None and err.response.status_code == status


def test_str_names_status_type_message_and_request_id(gateway):
    gateway.route("GET", "/v1/balance", gateway.error(402, "budget_exhausted", "Budget exhausted", request_id="req_9"))
    with gateway.gym() as gym, pytest.raises(rsigym.BudgetExhaustedError) as info:
        gym.balance()
    assert str(info.value) == "402 budget_exhausted: Budget exhausted (request_id req_9)"


def test_request_id_falls_back_to_the_body_when_the_header_is_missing(gateway):
    body = {
        "type": "error",
        "error": {"type": "not_found", "message": "no such key", "param": None},
        "request_id": "req_body",
    }
    gateway.route("POST", "/v1/keys/k1/revoke", httpx.Response(404, json=body))
    with gateway.gym() as gym, pytest.raises(rsigym.NotFoundError) as info:
        gym.keys.revoke("k1")
    assert info.value.request_id == "req_body"
    assert info.value.param is None


def test_non_json_body_still_gives_a_typed_error_with_the_text(gateway):
    html = "<html><body>502 Bad Gateway</body></html>"
    gateway.route(
        "GET",
        "/v1/balance",
        httpx.Response(502, text=html, headers={"Content-Type": "text/html", "X-Request-Id": "req_px"}),
    )
    with gateway.gym() as gym, pytest.raises(rsigym.InternalServerError) as info:
        gym.balance()
    err = info.value
    assert err.status_code == 502
    assert err.type == "internal_error"
    assert "502 Bad Gateway" in err.message
    assert err.request_id == "req_px"


def test_empty_error_body_uses_the_reason_phrase(gateway):
    gateway.route("GET", "/v1/keys", httpx.Response(404))
    with gateway.gym() as gym, pytest.raises(rsigym.NotFoundError) as info:
        gym.keys.list()
    assert info.value.message == "Not Found"
    assert info.value.type == "not_found"


def test_fastapi_validation_detail_becomes_message_and_param(gateway):
    detail = [{"loc": ["body", "messages"], "msg": "Field required", "type": "missing"}]
    gateway.route("POST", "/rollout/v1/chat/completions", httpx.Response(422, json={"detail": detail}))
    with gateway.gym() as gym, pytest.raises(rsigym.UnprocessableEntityError) as info:
        gym.rollout.chat(model="teacher", messages=[])
    assert info.value.param == "messages"
    assert "Field required" in info.value.message


def test_openai_style_error_body_is_understood(gateway):
    body = {"error": {"message": "model 'x' not found", "type": "invalid_request_error", "param": "model"}}
    gateway.route("POST", "/rollout/v1/chat/completions", httpx.Response(400, json=body))
    with gateway.gym() as gym, pytest.raises(rsigym.BadRequestError) as info:
        gym.rollout.chat(model="x", messages=[{"role": "user", "content": "hi"}])
    assert (info.value.type, info.value.param) == ("invalid_request_error", "model")


def test_unlisted_4xx_is_a_plain_api_status_error(gateway):
    gateway.route("GET", "/v1/balance", gateway.error(418, "teapot", "short and stout"))
    with gateway.gym() as gym, pytest.raises(rsigym.APIStatusError) as info:
        gym.balance()
    assert type(info.value) is rsigym.APIStatusError
    assert info.value.status_code == 418


def test_timeout_is_a_connection_error_subclass(gateway):
    gateway.route("POST", "/v1/keys", httpx.ReadTimeout("slow"))
    with gateway.gym() as gym, pytest.raises(rsigym.APITimeoutError) as info:
        gym.keys.mint(name="x")
    assert isinstance(info.value, rsigym.APIConnectionError)
    assert info.value.type == "timeout"
    assert "POST http://gym.test/v1/keys" in info.value.message


@pytest.mark.parametrize(
    ("type_", "cls", "status"),
    [
        ("budget_exhausted", rsigym.BudgetExhaustedError, 402),
        ("upstream_error", rsigym.InternalServerError, 502),
        ("rate_limited", rsigym.RateLimitError, 429),
        ("something_new", rsigym.APIStatusError, 200),
    ],
)
def test_stream_error_body_without_status_is_classed_by_type(type_, cls, status):
    response = httpx.Response(200, headers={"X-Request-Id": "req_s"})
    body = {"error": {"type": type_, "message": "went wrong", "param": None}}  # the rollout service's shape
    err = errors.error_from_body(body, response)
    assert type(err) is cls
    assert (err.status_code, err.type, err.message, err.request_id) == (status, type_, "went wrong", "req_s")


def test_error_hierarchy_is_catchable_at_every_level():
    assert issubclass(rsigym.ConfigurationError, rsigym.RSIGymError)
    assert issubclass(rsigym.APITimeoutError, rsigym.APIConnectionError)
    assert issubclass(rsigym.APIResponseValidationError, rsigym.RSIGymError)
    for _, cls, _ in STATUS_CLASSES:
        assert issubclass(cls, rsigym.APIStatusError)
