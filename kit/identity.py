"""The signed internal identity the gateway attaches to every call it forwards.

Services accept only calls carrying a valid signature: HMAC-SHA256 over the method, the
path, the identity and the SHA-256 of the exact body, with a secret only the gateway and
the services share. So a request that reaches a service directly — without the gateway's
authentication, policy and reservation — is refused, and a forwarded body cannot be altered.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from access.policy import ServicePolicy
from kit.errors import AuthenticationFailed

IDENTITY_HEADER = "X-RSIGym-Identity"
SIGNATURE_HEADER = "X-RSIGym-Signature"
COST_HEADER = "X-RSIGym-Internal-Cost-Nusd"
"""Service → gateway: the real cost of a non-streamed call (stripped before the client)."""
COST_TRAILER_PREFIX = b": rsigym-cost="
"""Service → gateway: the real cost of a streamed call, as an SSE comment line at the end."""
MAX_SKEW_S = 300.0
IN_PROCESS_IDENTITY = "rsigym.identity"
"""The ASGI scope key under which the embedded gateway hands its :class:`Identity` itself to a
service's hot-route handler that it calls in process (gateway/direct_call.py's transport; every
other transport signs). Such a call
crosses no socket and no transport, so there is nothing to sign or verify: the object was made
by the gateway's own ``forward`` for this call. Nothing a caller sends can set a scope key: a call
that arrives over HTTP or through the in-process transport carries only headers, and
:func:`verify` checks them. The object is not bound to a path as a signature is: a handler
given one must not hand its scope on to another route."""


class Identity(BaseModel):
    request_id: str
    key_id: str
    run_id: str
    service: str
    operation: str
    policies: list[ServicePolicy] = Field(default_factory=list)
    """The chain's policy for this service, root first (typed on both sides of the signature)."""
    chain_ids: list[str] = Field(default_factory=list)
    """The key and its ancestors, root first (for per-key caps held by services)."""
    concurrency_caps: list[tuple[str, int]] = Field(default_factory=list)
    """(key id, cap) of every key of the chain that caps this service, root first — for
    caps a service holds beyond one call (live sandboxes)."""
    reservation_id: str | None = None
    estimate_nusd: int = 0
    caller_key_id: str | None = None
    """The key that made the call when the call is billed to another account (the agent route
    bills the run's agent-model meter, ``key_id``); None: ``key_id`` made it."""
    operator: bool = False
    """An operator (admin token) call, e.g. an auditor reading a run's dataset."""
    issued_at: float


def _mac(secret: str, method: str, path: str, identity_b64: str, body: bytes) -> str:
    message = "\n".join([method.upper(), path, identity_b64, hashlib.sha256(body).hexdigest()])
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def sign(identity: Identity, secret: str, method: str, path: str, body: bytes) -> dict[str, str]:
    encoded = base64.urlsafe_b64encode(identity.model_dump_json().encode()).decode()
    return {IDENTITY_HEADER: encoded, SIGNATURE_HEADER: _mac(secret, method, path, encoded, body)}


def verify(headers: Any, secret: str, method: str, path: str, body: bytes, *, now: float | None = None) -> Identity:
    encoded = headers.get(IDENTITY_HEADER)
    signature = headers.get(SIGNATURE_HEADER)
    if not encoded or not signature:
        raise AuthenticationFailed("services accept only calls forwarded by the gym's gateway")
    expected = _mac(secret, method, path, encoded, body)
    if not hmac.compare_digest(expected, signature):
        raise AuthenticationFailed("invalid gateway signature")
    try:
        identity = Identity.model_validate_json(base64.urlsafe_b64decode(encoded.encode()))
    except (ValidationError, ValueError) as err:
        raise AuthenticationFailed("malformed gateway identity") from err
    if abs((now or time.time()) - identity.issued_at) > MAX_SKEW_S:
        raise AuthenticationFailed("expired gateway identity")
    return identity
