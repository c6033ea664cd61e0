"""Forwarding one call: authenticate → policy → concurrency slot → reserve → forward (the call
and the gateway's identity, handed to the service's transport: gateway/service_call.py) → settle
→ cost headers. Any failure before the service has done billable work releases the reservation;
nothing leaves a hold or a slot behind.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import httpx
from fastapi import Request
from fastapi.responses import Response

from access.keys import Principal
from access.policy import Policy, apply_chain, fill_left_out
from billing import rate_limits
from billing.ledger import Balance, Reservation
from billing.money import format_usd, nusd_to_usd
from gateway.access_log import note_key
from gateway.auth import authenticate, authenticate_key_id, presented_key
from gateway.context import Gateway, gateway_of
from gateway.service_call import ServiceCall, Upstream
from kit.body_limits import parse_json_object
from kit.canonical import canonical_body
from kit.config import GymConfig
from kit.errors import (
    AuthenticationFailed,
    BudgetExhausted,
    ConcurrencyLimited,
    GymError,
    KeyPaused,
    NotFound,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
)
from kit.http import ClosingStreamingResponse, request_id_of
from kit.identity import COST_HEADER, COST_TRAILER_PREFIX, Identity
from kit.spec import Operation, ServiceSpec
from services.sandbox.read import token_holder

log = logging.getLogger("rsigym.gateway")

_FORWARD_REQUEST_HEADERS = ("e2b-sandbox-id", "connect-protocol-version", "connect-timeout-ms",
                            "connect-content-encoding", "connect-accept-encoding", "keepalive-ping-interval")
"""Protocol headers a service needs besides the body (E2B's daemon, Connect RPC); the
caller's credentials never travel past the gateway."""
_PASS_THROUGH_STREAMS = ("application/connect+",)
"""Unmetered streamed responses relayed chunk by chunk (a sandbox command's output)."""
_DROP_RESPONSE_HEADERS = {"content-length", "transfer-encoding", "connection", "server", "date", "x-request-id",
                          COST_HEADER.lower()}
REFUSALS = (PermissionDenied, KeyPaused, BudgetExhausted, ConcurrencyLimited, RateLimited)
"""Refusals of a known principal that become ``call.refused`` events (policy, budget, concurrency)."""
REFUSED_STATUSES = (402, 403)
"""A service's own refusals (its standard error body) that are recorded the same way."""
STREAM_SEND_TIMEOUT_S = 120.0
"""A streamed response (SSE, a sandbox command's output) whose client accepts no data for this
long is cut. Until then the relay holds only a few chunks: a reader that does not read holds
its producer back (backpressure), so memory stays flat while it waits."""
INLINE_BODY_BYTES = 16 * 1024
"""A JSON body up to this size is parsed and policed on the event loop (tens of microseconds: less
than the trip to a worker thread and back); a larger one in a worker (``Gateway.body_work``)."""
COST_RESPONSE = "X-RSIGym-Cost-USD"
REMAINING_RESPONSE = "X-RSIGym-Remaining-USD"


def _policy_body(raw: bytes, config: GymConfig, policies: list[Policy], service: str,
                 op: Operation) -> tuple[dict[str, Any], bytes]:
    """Parse (within the JSON limits), one spelling per field, the effective value of every field
    a rule constrains and the body leaves out, policy, re-serialise: CPU work on a body, run off
    the event loop (``Gateway.body_work``) when the body is large enough to stall other calls
    (``INLINE_BODY_BYTES``)."""
    body = canonical_body(parse_json_object(raw, config.http, allows_nul=op.allows_nul), op.spellings)
    body = fill_left_out(policies, service, body, lambda path: op.default_of(path, body, config))
    body = apply_chain(policies, service, body, model_field=op.model_field)
    return body, json.dumps(body, separators=(",", ":")).encode()


def _estimates(op: Operation, body: dict[str, Any], context: Any, payer: Principal,
               count_tokens: bool) -> tuple[int, int | None]:
    """The call's worst-case cost and, when ``count_tokens`` (a key of the chain limits the
    service's tokens per minute), its worst-case tokens: its operation's hooks. Run in one trip
    to a worker thread unless the operation declares them pure: a hook may read the store (a
    checkpoint's base model, say)."""
    estimate = op.estimate(body, context, payer) if op.estimate is not None else 0
    return estimate, op.tokens(body, context, payer) if count_tokens and op.tokens is not None else None


TINKER_KEY_PREFIX = "tml-"
"""The Tinker SDK refuses an API key that does not start with ``tml-``: on its routes
(``auth="tinker_key"``) the run key is accepted written as ``tml-<run key>`` as well as bare."""


async def _authenticate(gw: Gateway, request: Request, op: Operation) -> Principal:
    key = presented_key(request)
    if op.auth == "tinker_key" and key is not None and key.startswith(TINKER_KEY_PREFIX):
        key = key[len(TINKER_KEY_PREFIX):]
    if key is None and op.auth == "sandbox_token":
        found = token_holder(gw.internal_secret, request.headers.get("x-access-token"))
        if found is None or request.headers.get("e2b-sandbox-id") != found[1]:
            raise AuthenticationFailed("invalid sandbox access token (or it is not this sandbox's)")
        return await authenticate_key_id(gw, found[0])
    return await authenticate(gw, key)


async def limit_tokens(gw: Gateway, principal: Principal, service: str, tokens: int) -> None:
    """Count a call's worst-case ``tokens`` against the chain's tokens-per-minute limits for
    ``service`` (``rate_limited`` 429 with Retry-After when any is used up this minute).
    The agent route calls this too, with its own service name."""
    limits = rate_limits.limits_of(principal, service)
    if limits:
        await gw.store.call(partial(rate_limits.reserve_tokens, gw.store, limits, tokens))


def check_grant(principal: Principal, service: str) -> None:
    # apply_chain on an empty body refuses a service that is not granted anywhere in the chain.
    apply_chain(list(principal.policies), service, {}, model_field=None)


@dataclass(frozen=True)
class BilledRoute:
    """A route family of the gateway's own (not in ``gw.specs``) that one service serves under a
    path prefix and that is billed to another account than the caller's: the agent route, served
    by the rollout service under ``/agent`` and billed on the run's agent-model meter
    (gateway/agent_model.py). Policy and the reservation apply to the ``payer``; authentication,
    run limits and refusal records stay the caller's."""

    spec: ServiceSpec
    served_by: str
    prefix: str
    payer: Callable[[Gateway, Principal], Awaitable[Principal]]


class _Call:
    """State of one forwarded call, so every exit path closes what it opened."""

    def __init__(self, gw: Gateway, service: str, op: Operation, principal: Principal, request_id: str,
                 caller: Principal | None = None, model: str | None = None):
        self.gw, self.service, self.op, self.principal, self.request_id = gw, service, op, principal, request_id
        self.caller = caller
        """The key that called, when ``principal`` (who pays) is another account."""
        self.model = model
        """The model the call names, kept on its ledger row (spend by model: billing/spend.py)."""
        self.lease: str | None = None
        self.reservation: Reservation | None = None
        self.closed = False

    async def open(self, estimate: int) -> None:
        gw = self.gw
        caps = self.principal.max_concurrency(self.service) if self.op.concurrency else []
        if caps:  # no cap anywhere on the chain: no slot to take, no trip to the store
            self.lease = await gw.store.call(gw.slots.acquire, caps, self.service)
        if self.op.metered:
            try:
                self.reservation = await gw.ledger.reserve_async(
                    self.principal.key_id,
                    service=self.service,
                    operation=self.op.name,
                    estimate_nusd=estimate,
                    request_id=self.request_id,
                    chain_ids=self.principal.chain_ids,
                    model=self.model,
                )
            except BaseException:
                await self.close(None)
                raise
            gw.metrics.of(self.service).reserved.inc()

    async def close(self, actual_nusd: int | None) -> tuple[int, Balance | None]:
        """Settle (``actual_nusd``) or release (None) and give back the slot. Idempotent, shielded.

        Returns what was charged and the balance after it (None when released or unmetered).
        """
        if self.closed:
            return 0, None
        self.closed = True
        gw, charged, balance = self.gw, 0, None
        with anyio.CancelScope(shield=True):
            try:
                if self.reservation is not None:
                    if actual_nusd is None:
                        await gw.ledger.release_async(self.reservation.id)
                        gw.metrics.of(self.service).released.inc()
                    else:
                        charged, balance = await gw.ledger.settle_with_balance_async(self.reservation.id, actual_nusd)
                        instruments = gw.metrics.of(self.service)
                        instruments.settled.inc()
                        instruments.spend.inc(nusd_to_usd(charged))
                        overrun = actual_nusd - self.reservation.estimate_nusd
                        if balance is not None and overrun > 0:  # charged the hold; the ledger row and log record the rest
                            instruments.overrun.inc(nusd_to_usd(overrun))
            finally:
                if self.lease is not None:
                    await gw.store.call(gw.slots.release, self.lease)
        return charged, balance


async def forward(request: Request, service: str, path: str, route: BilledRoute | None = None) -> Response:  # noqa: C901 - the door's one pass (auth, policy, slot, reserve, forward, settle), kept on one page
    gw = gateway_of(request)
    request_id = request_id_of(request)
    sub_path = "/" + path
    spec = route.spec if route is not None else gw.specs.get(service)
    op = spec.match(request.method, sub_path) if spec else None
    if op is None:
        raise NotFound(f"no route {request.method} /{service}{sub_path}")
    started = time.perf_counter()
    principal = await _authenticate(gw, request, op)
    note_key(request, principal.key_id)
    try:
        payer = principal if route is None else await route.payer(gw, principal)
        if op.json_body:
            raw_in = await request.body()  # bounded while it streamed in (kit/body_limits.py)
            policed = (list(payer.policies), service, op)
            inline = len(raw_in) <= INLINE_BODY_BYTES
            if inline:
                body, raw = _policy_body(raw_in, gw.config, *policed)
            else:
                body, raw = await anyio.to_thread.run_sync(_policy_body, raw_in, gw.config, *policed,
                                                           limiter=gw.body_work)
        else:
            check_grant(payer, service)
            inline, body, raw = True, {}, await request.body()
        estimate, tokens = 0, None
        count_tokens = op.tokens is not None and bool(rate_limits.limits_of(principal, service))
        if op.pure_estimates and inline:
            estimate, tokens = _estimates(op, body, gw.context, payer, count_tokens)
        elif op.estimate is not None or count_tokens:
            estimate, tokens = await anyio.to_thread.run_sync(_estimates, op, body, gw.context, payer, count_tokens)

        if tokens is not None:  # before the reservation: a rate-limited call leaves no ledger row
            await limit_tokens(gw, principal, service, tokens)

        call = _Call(gw, service, op, payer, request_id, caller=principal if route is not None else None,
                     model=_model_of(op, body))
        await call.open(estimate)
    except REFUSALS as err:
        await _record_refusal(gw, principal, service, op.name, err.status, err.type, err.message, err.param)
        raise
    instruments = gw.metrics.of(service)
    instruments.in_flight.inc()
    try:
        target_service, target_path = (service, sub_path) if route is None else (route.served_by, route.prefix + sub_path)
        upstream = await _send(gw, request, target_service, target_path, raw, _identity(call, estimate))
    except BaseException:
        instruments.in_flight.dec()
        await call.close(None)
        raise
    instruments.latency.observe(time.perf_counter() - started)
    gw.metrics.requests.labels(service, op.name, str(upstream.status_code)).inc()
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}
    headers["X-Request-Id"] = request_id

    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        if call.reservation is not None and call.reservation.balance is not None:
            headers[COST_RESPONSE] = format_usd(estimate)  # upper bound; exact cost in the stream's usage
            headers["X-RSIGym-Cost-Kind"] = "reserved-upper-bound"
            headers[REMAINING_RESPONSE] = call.reservation.balance.remaining_header
        return ClosingStreamingResponse(_relay(call, upstream, estimate), status_code=upstream.status_code,
                                        headers=headers, send_timeout_s=STREAM_SEND_TIMEOUT_S)
    if not op.metered and upstream.headers.get("content-type", "").startswith(_PASS_THROUGH_STREAMS):
        return ClosingStreamingResponse(_pass_through(call, upstream), status_code=upstream.status_code,
                                        headers=headers, send_timeout_s=STREAM_SEND_TIMEOUT_S)

    try:
        content = await upstream.aread()
    except BaseException:
        await call.close(estimate)  # the service may have worked: bill the hold
        raise
    finally:
        instruments.in_flight.dec()
        await upstream.aclose()
    reported = upstream.headers.get(COST_HEADER)
    if reported is not None:
        charged, balance = await call.close(int(reported))
    elif upstream.status_code >= 400:
        charged, balance = await call.close(None)
    else:  # a success that reported no cost is billed its reservation, never free
        charged, balance = await call.close(estimate)
    if upstream.status_code in REFUSED_STATUSES:
        error = _error_of(content)
        await _record_refusal(gw, principal, service, op.name, upstream.status_code, error.get("type"),
                              error.get("message"), error.get("param"))
    if call.reservation is not None:
        if balance is None:  # released: read the balance as it stands
            balance = await gw.store.call(gw.ledger.balance, principal.key_id)
        headers[COST_RESPONSE] = format_usd(charged)
        headers[REMAINING_RESPONSE] = balance.remaining_header
    return Response(content, status_code=upstream.status_code, headers=headers)


async def _record_refusal(gw: Gateway, principal: Principal, service: str, operation: str, status: int,
                          error: Any, rule: Any, param: Any) -> None:
    """A ``call.refused`` event for the principal's run. Only refusals pay for it (successes never
    do), and a record that cannot be written is logged: it never replaces the refusal itself."""
    data = {"where": "gateway", "service": service, "operation": operation, "status": status,
            "error": error if isinstance(error, str) else None, "rule": rule if isinstance(rule, str) else None,
            "param": param if isinstance(param, str) else None}
    try:
        await gw.store.call(partial(gw.records.call_refused, run_id=principal.run_id, key_id=principal.key_id,
                                    data=data))
    except Exception as err:  # noqa: BLE001 - the caller gets the original answer whatever happens here
        log.warning("refused %s call of key %s not recorded: %s", service, principal.key_id, type(err).__name__)


def _model_of(op: Operation, body: dict[str, Any]) -> str | None:
    """The model a metered call names: its operation's model field, else ``model`` (inference
    polices a checkpoint's base model itself, so its operations declare none, but name one)."""
    if not op.metered:
        return None
    model = body.get(op.model_field or "model")
    return model[:200] if isinstance(model, str) else None


def _error_of(content: bytes) -> dict[str, Any]:
    """The ``error`` object of a service's standard error body ({} when it is not one)."""
    try:
        body = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def _identity(call: _Call, estimate: int) -> Identity:
    return Identity(
        request_id=call.request_id,
        key_id=call.principal.key_id,
        run_id=call.principal.run_id,
        service=call.service,
        operation=call.op.name,
        policies=call.principal.service_policies(call.service),
        chain_ids=list(call.principal.chain_ids),
        concurrency_caps=call.principal.max_concurrency(call.service),
        reservation_id=call.reservation.id if call.reservation else None,
        estimate_nusd=estimate,
        caller_key_id=call.caller.key_id if call.caller is not None else None,
        issued_at=time.time(),
    )


async def _send(gw: Gateway, request: Request, service: str, sub_path: str, raw: bytes, identity: Identity) -> Upstream:
    headers = {
        "content-type": request.headers.get("content-type", "application/json"),
        "accept": request.headers.get("accept", "*/*"),
        "accept-encoding": "identity",  # bodies are relayed as they come; never a decoded body under a gzip header
        "x-request-id": identity.request_id,
        **{h: request.headers[h] for h in _FORWARD_REQUEST_HEADERS if h in request.headers},
    }
    query = request.scope.get("query_string", b"").decode("latin-1")
    call = ServiceCall(request.method, sub_path, query, headers, raw, identity, gw.internal_secret)
    try:
        return await gw.links[service].send(call)
    except httpx.HTTPError as err:
        log.warning("service %s unreachable (%s): %s", service, identity.request_id, type(err).__name__)
        raise ServiceUnavailable(f"the {service} service is unavailable; nothing was charged") from err


async def _relay(call: _Call, upstream: Upstream, estimate: int) -> AsyncIterator[bytes]:
    """Pass SSE through, strip the service's cost trailer and settle on it at the end.

    If the stream ends without a trailer (service crash) or the client goes away first,
    the call is billed its reservation — unless the service settled it first for the work it
    did (inference does, when its reader goes away): a stream is never let through unmetered.
    """
    cost: int | None = None
    pending = b""
    skip_blank = False
    try:
        async for chunk in upstream.aiter_raw():
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop()
            out: list[bytes] = []
            for line in lines:
                if line.startswith(COST_TRAILER_PREFIX):
                    cost = int(line[len(COST_TRAILER_PREFIX):].strip() or b"0")
                    # Settle before the client sees the end of the stream, so a balance read
                    # right after [DONE] already shows the exact charge.
                    await call.close(cost)
                    skip_blank = True
                    continue
                if skip_blank and not line.strip():
                    skip_blank = False
                    continue
                skip_blank = False
                out.append(line + b"\n")
            if out:
                yield b"".join(out)
        if pending and not pending.startswith(COST_TRAILER_PREFIX):
            yield pending
    except GymError:
        raise
    except httpx.HTTPError as err:  # the service died mid-stream: end the stream with the standard error
        log.warning("%s: the %s service broke its stream off (%s)", call.request_id, call.service, type(err).__name__)
        gone = ServiceUnavailable(f"the {call.service} service went away in the middle of this stream")
        yield b"\ndata: " + json.dumps(gone.body(call.request_id), separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"
    finally:
        call.gw.metrics.of(call.service).in_flight.dec()
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
        await call.close(cost if cost is not None else estimate)


async def _pass_through(call: _Call, upstream: Upstream) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        call.gw.metrics.of(call.service).in_flight.dec()
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
        await call.close(None)


async def operator_call(gw: Gateway, service: str, method: str, path: str, request_id: str,
                        body: bytes = b"", query: str = "") -> httpx.Response:
    """A signed call made for the operator (audits, benchmarks, scoring): not a run, not metered.
    ``path`` is decoded (ids as they are); ``query`` is already URL-encoded."""
    if service not in gw.links:
        raise NotFound(f"the {service} service is not part of this gym")
    identity = Identity(request_id=request_id, key_id="operator", run_id="operator", service=service,
                        operation="operator", operator=True, issued_at=time.time())
    headers = {"x-request-id": request_id, "content-type": "application/json", "accept-encoding": "identity"}
    call = ServiceCall(method, path, query, headers, body, identity, gw.internal_secret)
    try:
        return await gw.links[service].client.request(method, call.target, headers=call.signed_headers(), content=body)
    except httpx.HTTPError as err:
        raise ServiceUnavailable(f"the {service} service is unavailable") from err
