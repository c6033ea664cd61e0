"""The one error vocabulary of the gym.

Every refusal anywhere (gateway, services, workers) is a :class:`GymError` subclass and
leaves the process through :func:`error_response`, so clients always see the same shape::

    {"type": "error", "error": {"type": "budget_exhausted", "message": "...", "param": null},
     "request_id": "req_...", "code": 402, "message": "..."}

(``code`` and the top-level ``message`` repeat the status and message in the shape E2B's
SDK reads, so its exceptions carry our message too.)
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from fastapi.responses import JSONResponse


class GymError(Exception):
    """Base class: an HTTP status and a stable machine-readable ``type``."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self, request_id: str | None) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {"type": self.type, "message": self.message, "param": self.param},
            "request_id": request_id,
            "code": self.status,
            "message": self.message,
        }


class InvalidRequest(GymError):
    status, type = 400, "invalid_request_error"


class AuthenticationFailed(GymError):
    status, type = 401, "authentication_error"


class KeyRevoked(GymError):
    status, type = 401, "key_revoked"


class BudgetExhausted(GymError):
    status, type = 402, "budget_exhausted"


class PermissionDenied(GymError):
    status, type = 403, "permission_denied"


class KeyPaused(GymError):
    status, type = 403, "key_paused"


class RunEnded(GymError):
    """The run's wall-clock deadline (``ends_at``) has passed: every key of the run is refused.
    403, not 410: the SDK maps one class per status and the key itself still exists (an operator
    may move the deadline); the ``run_ended`` type is what a client tells apart."""

    status, type = 403, "run_ended"


class NotFound(GymError):
    status, type = 404, "not_found"


class Conflict(GymError):
    status, type = 409, "conflict"


class Unprocessable(GymError):
    status, type = 422, "invalid_request_error"


class NotSupported(GymError):
    """A request for something the gym deliberately does not do (an E2B call such as pausing a
    sandbox): 400 with its own type, never a 404 that reads as "that thing does not exist", nor
    a 409 that E2B's SDK reads as "already done"."""

    status, type = 400, "not_supported"


class ConcurrencyLimited(GymError):
    status, type = 429, "concurrency_limit"


class InternalError(GymError):
    status, type = 500, "internal_error"


class UpstreamError(GymError):
    status, type = 502, "upstream_error"


class StoreUnavailable(GymError):
    status, type = 503, "store_unavailable"


class KeptConnectionLost(StoreUnavailable):
    """A transaction on the store writer's kept connection (storage/store.py,
    ``Store.keeping_connection``) found it lost before its commit was sent: nothing was written,
    and the work may run again on a fresh connection."""


class WouldWait(Exception):  # noqa: N818 - a signal between store and group commit, not an error
    """``Store.run_unwaiting`` found another writer at work and ran nothing: the caller goes
    the waiting way instead (storage/group_commit.py). Never reaches a client."""


class ServiceUnavailable(GymError):
    status, type = 503, "service_unavailable"


STORAGE_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def storage_full(err: BaseException) -> ServiceUnavailable | None:
    """The gym's own disk is full (ENOSPC / EDQUOT anywhere in ``err``'s chain): a 503 that says
    so, instead of an anonymous internal error. None for any other error."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in STORAGE_FULL_ERRNOS:
            return ServiceUnavailable("the gym's storage is full: nothing was stored, and nothing was charged for it")
        seen = seen.__cause__ or seen.__context__
    return None


def error_response(exc: GymError, request_id: str | None) -> JSONResponse:
    """The error factory: the only way an error becomes an HTTP response."""
    # Imported here: the operator CLI imports this module for GymError and never answers HTTP, and
    # fastapi was ~0.17 s of its 0.75 s start (tests/unit/ops/test_cli_start.py keeps it out).
    from fastapi.responses import JSONResponse

    headers = {**exc.headers}
    if request_id:
        headers["X-Request-Id"] = request_id
    return JSONResponse(exc.body(request_id), status_code=exc.status, headers=headers)


class UpstreamRateLimited(GymError):
    status, type = 429, "rate_limited"


class RateLimited(GymError):
    """A key's (or an ancestor's) tokens-per-minute limit is used up for this minute; the
    ``Retry-After`` header says when the next minute starts."""

    status, type = 429, "rate_limited"


class UpstreamTimeout(GymError):
    status, type = 504, "upstream_timeout"


def validated[M: BaseModel](model: type[M], data: Any, *, what: str, error: type[GymError] | None = None,
                            prefix: str = "") -> M:
    """``model.model_validate(data)``, or a refusal naming the first problem's field:
    ``invalid <what>: <prefix><field>: <pydantic's message>`` — a 422, the one status of a body
    that fails validation, unless ``error`` says otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = prefix + ".".join(str(p) for p in _where(first["loc"]))
        raise (error or Unprocessable)(f"invalid {what}: {param}: {first['msg']}", param=param or None) from err


def _where(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """A validation error's location as a dotted path names it: a refused mapping key (pydantic's
    ``[key]``, as a policy's misspelt ``services.rolout``) is located at the key itself."""
    return loc[:-1] if loc and loc[-1] == "[key]" else loc


def parsed_request[M: BaseModel](schema: type[M], body: Any) -> M:
    """An API request body as ``schema``, or one 422 naming the first problem's field — ``unsupported
    field 'x'`` for a field the schema forbids, else ``<field>: <pydantic's message>`` (the
    OpenAI-style routes' wording: rollout chat, Responses, Anthropic Messages)."""
    try:
        return schema.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise Unprocessable(f"unsupported field {param!r}", param=param) from None
        raise Unprocessable(f"{param}: {first['msg']}", param=param) from None


class PayloadTooLarge(GymError):
    """One object (a dataset, a harness archive or what it unpacks to, a checkpoint …) is over its
    per-object size limit, whatever the run's storage quota says; or a request body over its route's
    size or JSON-shape limit, refused while it streams in (kit/body_limits.py)."""

    status, type = 413, "payload_too_large"


class HeadTooLarge(GymError):
    """The request line and headers together are over ``[http] max_header_bytes``: refused by the
    HTTP server before any route or middleware runs (kit/http_protocol.py)."""

    status, type = 431, "request_header_too_large"


class QuotaExceeded(GymError):
    """Storing this would take the run past its storage quota (billing/storage_quota.py).
    403 like ``run_ended``: more money would not help, the ``quota_exceeded`` type tells it apart."""

    status, type = 403, "quota_exceeded"


class RequestTimeout(GymError):
    """The request's body did not arrive within the gym's body-read time (a client that trickles
    its body, slowloris): the connection is cut (kit/body_limits.py)."""

    status, type = 408, "request_timeout"
