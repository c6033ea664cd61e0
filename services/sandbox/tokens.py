"""Sandbox access tokens: what the E2B SDK sends to a sandbox's daemon (``X-Access-Token``).

The daemon calls of the E2B protocol carry no API key, only the token the create call
returned. Ours names the key and the sandbox and is signed with the gym's internal secret,
so the gateway can authenticate a daemon call (and apply the key's status: a revoked or
paused key's tokens stop working at once) without a lookup table. A token opens only its
own sandbox, and only while the sandbox runs.
"""

from __future__ import annotations

import hashlib
import hmac

PREFIX = "sbt"


def _mac(secret: str, key_id: str, sandbox_id: str) -> str:
    return hmac.new(secret.encode(), f"sandbox-token\n{key_id}\n{sandbox_id}".encode(), hashlib.sha256).hexdigest()


def mint(secret: str, key_id: str, sandbox_id: str) -> str:
    return f"{PREFIX}.{key_id}.{sandbox_id}.{_mac(secret, key_id, sandbox_id)}"


def verify(secret: str, token: str | None) -> tuple[str, str] | None:
    """(key id, sandbox id) of a valid token, else None."""
    if not token:
        return None
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != PREFIX:
        return None
    _, key_id, sandbox_id, mac = parts
    if not hmac.compare_digest(mac, _mac(secret, key_id, sandbox_id)):
        return None
    return key_id, sandbox_id
