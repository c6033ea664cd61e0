"""The dashboard's login session: an HMAC-signed, expiring cookie.

The admin token is typed into a form once; the browser then holds only a signed session, so
the token never sits in a URL, a history entry or a log line. The signing key is derived
from the admin token *and* the internal secret: every gateway replica shares both and accepts
the same cookie, and rotating either logs every browser out. The cookie opens the ``/admin/ui``
pages only — the JSON admin API still wants the token in a header, so a page on another site
cannot use a logged-in browser to move money (there is no CSRF surface to defend there).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

COOKIE = "rsigym_ui"
PATH = "/admin/ui"
_CONTEXT = b"rsigym/dashboard-session/v1\0"


def session_key(admin_token: str, internal_secret: str) -> bytes:
    return hmac.new(admin_token.encode(), _CONTEXT + internal_secret.encode(), hashlib.sha256).digest()


def token_matches(presented: str, admin_token: str) -> bool:
    """Constant-time comparison of a typed token with the admin token."""
    return bool(presented) and hmac.compare_digest(presented.encode(), admin_token.encode())


def _sign(key: bytes, payload: str) -> str:
    mac = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class Session:
    issued_at: int
    expires_at: int


def issue(key: bytes, ttl_s: int, now: float | None = None) -> str:
    """A cookie value ``v1.<issued>.<expires>.<nonce>.<mac>``."""
    issued = int(now if now is not None else time.time())
    payload = f"v1.{issued}.{issued + ttl_s}.{secrets.token_urlsafe(12)}"
    return f"{payload}.{_sign(key, payload)}"


def verify(key: bytes, value: str | None, now: float | None = None) -> Session | None:
    """The session a cookie value proves, or None (missing, forged, malformed or expired)."""
    if not value or len(value) > 256:
        return None
    payload, _, mac = value.rpartition(".")
    if not payload or not hmac.compare_digest(mac.encode(), _sign(key, payload).encode()):
        return None
    parts = payload.split(".")
    if len(parts) != 4 or parts[0] != "v1" or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    issued, expires = int(parts[1]), int(parts[2])
    if (now if now is not None else time.time()) >= expires:
        return None
    return Session(issued, expires)
