"""When to retry a request, and how long to wait first.

The rules, in order of importance:

* Never retry an answer that reflects a decision: 402 (budget), 400/401/403/404/409/422,
  500, … are raised at once.
* 429 and 503 are refusals *before* any work (rate limit, or the ledger store being down
  and the gateway failing closed), so they are retried for every method, after the
  ``Retry-After`` the server asked for (or an exponential backoff with jitter). A
  ``Retry-After`` longer than :data:`MAX_RETRY_AFTER` is not waited out: the error is
  raised so the caller can decide.
* A transport failure is retried for any method only when the request cannot have
  reached the server (connect error / connect timeout / no free pooled connection).
  A POST that may have been sent (read timeout, reset mid-answer) is *not* retried:
  it may have run upstream and been charged. GET and other idempotent methods are.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

__all__ = ["RetryPolicy", "parse_retry_after", "sleep", "async_sleep"]

INITIAL_DELAY = 0.5  # seconds before the first retry when the server gives no Retry-After
MAX_DELAY = 8.0
MAX_RETRY_AFTER = 60.0
RETRY_STATUSES = frozenset({429, 503})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})

# The request never left this machine: safe to resend whatever the method.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# The request may have been received; only an idempotent one may be resent.
_MAYBE_SENT = (httpx.ReadError, httpx.WriteError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.RemoteProtocolError)


def sleep(seconds: float) -> None:
    """Blocking wait between attempts (a function of its own so tests can replace it)."""
    time.sleep(seconds)


async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def parse_retry_after(headers: httpx.Headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (delta-seconds or HTTP-date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(float(raw_ms) / 1000.0, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 2

    def backoff(self, retries_done: int) -> float:
        base = min(INITIAL_DELAY * 2.0**retries_done, MAX_DELAY)
        return base * (1.0 - 0.25 * random.random())

    def delay_after_status(self, response: httpx.Response, retries_done: int) -> float | None:
        """Seconds to wait before retrying this error answer, or None to raise it."""
        if retries_done >= self.max_retries or response.status_code not in RETRY_STATUSES:
            return None
        retry_after = parse_retry_after(response.headers)
        if retry_after is None:
            return self.backoff(retries_done)
        return retry_after if retry_after <= MAX_RETRY_AFTER else None

    def delay_after_exception(self, method: str, exc: httpx.TransportError, retries_done: int) -> float | None:
        """Seconds to wait before resending after a transport failure, or None to raise it."""
        if retries_done >= self.max_retries:
            return None
        if isinstance(exc, _NOT_SENT) or (method.upper() in IDEMPOTENT_METHODS and isinstance(exc, _MAYBE_SENT)):
            return self.backoff(retries_done)
        return None
