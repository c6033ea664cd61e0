"""Exceptions raised by the SDK, modelled on anthropic-sdk-python.

::

    RSIGymError
    ├── ConfigurationError            bad or missing client settings (no API key, …)
    ├── APIConnectionError            the request never got an HTTP answer
    │   └── APITimeoutError
    ├── APIResponseValidationError    an answer the SDK cannot parse
    └── APIStatusError                the gateway answered 4xx / 5xx
        ├── BadRequestError           400
        ├── AuthenticationError       401
        ├── BudgetExhaustedError      402
        ├── PermissionDeniedError     403
        ├── NotFoundError             404 (also "exists but not yours": ids never leak)
        ├── ConflictError             409
        ├── UnprocessableEntityError  422
        ├── RateLimitError            429
        ├── ServiceUnavailableError   503 (e.g. the ledger store is down: the call was refused)
        └── InternalServerError       other 5xx

Every :class:`APIStatusError` carries ``status_code``, ``type``, ``message``, ``param``
and ``request_id`` taken from the gateway's error body
``{"type":"error","error":{"type":…,"message":…,"param":…},"request_id":…}``.
Bodies of any other shape (FastAPI ``{"detail": …}``, OpenAI ``{"error": {…}}``, plain
text from a proxy) still give a usable message; ``type`` then falls back to the
class's ``default_type``.
"""

from __future__ import annotations

import json
from typing import ClassVar

import httpx

__all__ = [
    "RSIGymError",
    "ConfigurationError",
    "APIConnectionError",
    "APITimeoutError",
    "APIResponseValidationError",
    "APIStatusError",
    "BadRequestError",
    "AuthenticationError",
    "BudgetExhaustedError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "UnprocessableEntityError",
    "RateLimitError",
    "ServiceUnavailableError",
    "InternalServerError",
    "error_from_response",
    "error_from_body",
]

_MAX_TEXT_MESSAGE = 500  # characters of a non-JSON error body kept as the message


class RSIGymError(Exception):
    """Base class of every exception the SDK raises on purpose."""

    type: str = "rsigym_error"
    request_id: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigurationError(RSIGymError):
    type = "configuration_error"


class APIConnectionError(RSIGymError):
    """No HTTP answer: DNS, refused connection, reset, protocol error, …"""

    type = "connection_error"

    def __init__(self, message: str = "Connection error.", *, request: httpx.Request | None = None) -> None:
        super().__init__(message)
        self.request = request


class APITimeoutError(APIConnectionError):
    type = "timeout"

    def __init__(self, message: str = "Request timed out.", *, request: httpx.Request | None = None) -> None:
        super().__init__(message, request=request)


class APIResponseValidationError(RSIGymError):
    """A 2xx answer whose body does not match what the endpoint promises."""

    type = "invalid_response"

    def __init__(self, message: str, *, response: httpx.Response | None = None) -> None:
        super().__init__(message)
        self.response = response
        self.request_id = response.headers.get("x-request-id") if response is not None else None


class APIStatusError(RSIGymError):
    """The gateway (or a service behind it) answered with an error status."""

    status: ClassVar[int | None] = None  # the status a subclass stands for
    default_type: ClassVar[str] = "api_error"

    def __init__(
        self,
        status_code: int,
        type: str,  # mirrors the error body's field name
        message: str,
        param: str | None = None,
        request_id: str | None = None,
        response: httpx.Response | None = None,
        body: object = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.type = type
        self.param = param
        self.request_id = request_id
        self.response = response
        self.body = body

    def __str__(self) -> str:
        text = f"{self.status_code} {self.type}: {self.message}"
        if self.param:
            text += f" (param {self.param})"
        if self.request_id:
            text += f" (request_id {self.request_id})"
        return text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status_code={self.status_code!r}, type={self.type!r}, "
            f"message={self.message!r}, param={self.param!r}, request_id={self.request_id!r})"
        )


class BadRequestError(APIStatusError):
    status = 400
    default_type = "invalid_request_error"


class AuthenticationError(APIStatusError):
    status = 401
    default_type = "authentication_error"


class BudgetExhaustedError(APIStatusError):
    status = 402
    default_type = "budget_exhausted"


class PermissionDeniedError(APIStatusError):
    status = 403
    default_type = "permission_denied"


class NotFoundError(APIStatusError):
    status = 404
    default_type = "not_found"


class ConflictError(APIStatusError):
    status = 409
    default_type = "conflict"


class UnprocessableEntityError(APIStatusError):
    status = 422
    default_type = "invalid_request_error"


class RateLimitError(APIStatusError):
    status = 429
    default_type = "rate_limited"


class ServiceUnavailableError(APIStatusError):
    status = 503
    default_type = "service_unavailable"


class InternalServerError(APIStatusError):
    default_type = "internal_error"


_BY_STATUS: dict[int, type[APIStatusError]] = {
    cls.status: cls
    for cls in (
        BadRequestError,
        AuthenticationError,
        BudgetExhaustedError,
        PermissionDeniedError,
        NotFoundError,
        ConflictError,
        UnprocessableEntityError,
        RateLimitError,
        ServiceUnavailableError,
    )
    if cls.status is not None
}
# For errors that arrive inside a 200 stream, where no status tells the kind: the
# gateway's error vocabulary (kit/errors.py) and the status each type has.
_BY_TYPE: dict[str, tuple[type[APIStatusError], int]] = {
    "invalid_request_error": (BadRequestError, 400),
    "authentication_error": (AuthenticationError, 401),
    "key_revoked": (AuthenticationError, 401),
    "budget_exhausted": (BudgetExhaustedError, 402),
    "permission_denied": (PermissionDeniedError, 403),
    "key_paused": (PermissionDeniedError, 403),
    "quota_exceeded": (PermissionDeniedError, 403),
    "not_found": (NotFoundError, 404),
    "conflict": (ConflictError, 409),
    "rate_limited": (RateLimitError, 429),
    "concurrency_limit": (RateLimitError, 429),
    "internal_error": (InternalServerError, 500),
    "upstream_error": (InternalServerError, 502),
    "store_unavailable": (ServiceUnavailableError, 503),
    "service_unavailable": (ServiceUnavailableError, 503),
    "upstream_timeout": (InternalServerError, 504),
}


def _class_for_status(status_code: int) -> type[APIStatusError]:
    if status_code in _BY_STATUS:
        return _BY_STATUS[status_code]
    if status_code >= 500:
        return InternalServerError
    return APIStatusError


def _str_or_none(value: object) -> str | None:
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _fastapi_detail(detail: object) -> tuple[str | None, str | None]:
    """Message and param from FastAPI's ``{"detail": …}`` (a string or validation items)."""
    if isinstance(detail, str):
        return detail, None
    if isinstance(detail, list) and detail and all(isinstance(item, dict) for item in detail):
        parts, param = [], None
        for item in detail:
            loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
            param = param or loc or None
            parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
        return "; ".join(parts), param
    return _str_or_none(detail), None


def _fields_from_body(body: object) -> tuple[str | None, str | None, str | None, str | None]:
    """(type, message, param, request_id) from any JSON error body we know of."""
    if not isinstance(body, dict):
        return None, _str_or_none(body), None, None
    request_id = _str_or_none(body.get("request_id"))
    error = body.get("error")
    if isinstance(error, dict):  # ours, and OpenAI's
        return (
            _str_or_none(error.get("type")) or _str_or_none(error.get("code")),
            _str_or_none(error.get("message")),
            _str_or_none(error.get("param")),
            request_id,
        )
    if isinstance(error, str):
        return None, error, None, request_id
    if "detail" in body:
        message, param = _fastapi_detail(body["detail"])
        return None, message, param, request_id
    return _str_or_none(body.get("type")), _str_or_none(body.get("message")), None, request_id


def error_from_response(response: httpx.Response) -> APIStatusError:
    """Build the typed exception for an error response (whose body must already be read)."""
    try:
        body: object = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    cls = _class_for_status(response.status_code)
    type_, message, param, body_request_id = _fields_from_body(body)
    if message is None:
        text = response.text.strip()
        message = text[:_MAX_TEXT_MESSAGE] if text else (response.reason_phrase or f"HTTP {response.status_code}")
    return cls(
        status_code=response.status_code,
        type=type_ or cls.default_type,
        message=message,
        param=param,
        request_id=response.headers.get("x-request-id") or body_request_id,
        response=response,
        body=body if body is not None else response.text,
    )


def error_from_body(body: object, response: httpx.Response) -> APIStatusError:
    """Build the typed exception for an error event sent inside a successful stream.

    The HTTP status is already 200 by then, so the class and ``status_code`` are those
    of the error's ``type`` (``budget_exhausted`` → :class:`BudgetExhaustedError`, 402;
    ``upstream_error`` → :class:`InternalServerError`, 502; …), or follow a
    ``status_code`` field when the server sends one; an unknown type gives a plain
    :class:`APIStatusError` with the response's status.
    """
    type_, message, param, body_request_id = _fields_from_body(body)
    status = body.get("status_code") if isinstance(body, dict) else None
    if isinstance(status, int) and status >= 400:
        cls = _class_for_status(status)
    else:
        cls, status = _BY_TYPE.get(type_ or "", (APIStatusError, response.status_code))
    return cls(
        status_code=status,
        type=type_ or cls.default_type,
        message=message or "error in stream",
        param=param,
        request_id=body_request_id or response.headers.get("x-request-id"),
        response=response,
        body=body,
    )


def error_from_transport(exc: httpx.TransportError) -> APIConnectionError:
    """Wrap an httpx transport failure (the original stays as ``__cause__``)."""
    try:
        request: httpx.Request | None = exc.request
    except RuntimeError:  # httpx raises when the exception was made without a request
        request = None
    where = f" ({request.method} {request.url})" if request is not None else ""
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"Request timed out{where}: {type(exc).__name__}", request=request)
    detail = str(exc) or type(exc).__name__
    return APIConnectionError(f"Connection error{where}: {detail}", request=request)
