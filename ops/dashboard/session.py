"""The dashboard's login sessions, kept server-side in the gym's store (``dashboard_sessions``).

The admin token is typed into a form once; the browser then holds only a random session id in
the ``rsigym_ui`` cookie (HttpOnly, SameSite=Strict, ``Path=/admin/ui``, Secure on https), so the
token never sits in a URL, a history entry or a log line. The store keeps, per session, the
id's HMAC (never the id), a CSRF token, when it was made and last used, and when it expires:
after ``session_idle_s`` unused or ``session_ttl_s`` in all. Hence:

* **logout ends it**: the row is deleted, so a copy of the cookie taken before is refused at once,
  on every replica (they all read the same store), and nothing can bring the session back;
* **rotating the admin token (or the internal secret) ends every session**: the HMAC key is
  derived from both, so no stored hash matches any cookie any more;
* a reader of the store learns no cookie that opens the dashboard.

The cookie opens the ``/admin/ui`` pages only — the JSON admin API still wants the token in a
header. Form posts that change state (logout, and the operator's run actions: ops/dashboard/actions.py)
must carry the session's CSRF token (:func:`csrf_matches`); the login form, which has no session yet,
carries a token bound to a short-lived cookie of its own (:func:`login_csrf`, a signed
double-submit). Session ids are never logged: they travel only in the Cookie header, which no
log line of the gym records.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_

from access.operator_sessions import DashboardSession
from ops.dashboard.settings import DashboardSettings
from storage.store import Store
from storage.tables import utcnow

COOKIE = "rsigym_ui"
LOGIN_COOKIE = "rsigym_ui_login"
"""The login form's own cookie: the nonce its CSRF token is bound to (``Path=/admin/ui/login``)."""
PATH = "/admin/ui"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
TOUCH_EVERY = timedelta(seconds=60)
"""``last_seen`` is rewritten at most this often: a page that refreshes every 15 s costs one
store write a minute, not four."""
_CONTEXT = b"rsigym/dashboard-session/v1\0"
_MAX_ID = 128


def session_key(admin_token: str, internal_secret: str) -> bytes:
    """The key session ids are hashed under (and the login form's tokens signed with)."""
    return hmac.new(admin_token.encode(), _CONTEXT + internal_secret.encode(), hashlib.sha256).digest()


def token_matches(presented: str, admin_token: str) -> bool:
    """Constant-time comparison of a typed token with the admin token."""
    return bool(presented) and hmac.compare_digest(presented.encode(), admin_token.encode())


def id_hash(key: bytes, session_id: str) -> str:
    return hmac.new(key, b"session-id\0" + session_id.encode(), hashlib.sha256).hexdigest()


def login_csrf(key: bytes, nonce: str) -> str:
    """The login form's CSRF token for the nonce in its cookie: a page on another site can
    neither read the cookie nor compute the token."""
    return hmac.new(key, b"login-form\0" + nonce.encode(), hashlib.sha256).hexdigest()


def csrf_matches(expected: str, presented: str | None) -> bool:
    """Constant-time comparison of a posted CSRF token with the expected one."""
    return bool(presented) and hmac.compare_digest((presented or "").encode(), expected.encode())


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class UiSession:
    """A live session, as a request sees it."""

    id_hash: str
    csrf: str
    created_at: datetime
    expires_at: datetime


class Sessions:
    """The sessions of one dashboard (one admin token): start, find, end. Blocking store calls:
    routes run them through ``Store.call``."""

    def __init__(self, store: Store, key: bytes, settings: DashboardSettings):
        self.store, self.key, self.settings = store, key, settings

    def _idle(self) -> timedelta:
        return timedelta(seconds=self.settings.session_idle_s)

    def start(self, *, replacing: str | None = None, now: datetime | None = None) -> tuple[str, UiSession]:
        """A fresh session: its id (the cookie's value, returned once, stored nowhere) and its
        view. ``replacing``: the id the browser held before, ended here. Sessions past their
        expiry are cleared on the way."""
        now = now or utcnow()
        session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        row = DashboardSession(id_hash=id_hash(self.key, session_id), csrf=csrf, created_at=now, last_seen=now,
                               expires_at=now + timedelta(seconds=self.settings.session_ttl_s))
        with self.store.transaction() as s:
            s.execute(delete(DashboardSession)
                      .where(or_(DashboardSession.expires_at <= now, DashboardSession.last_seen <= now - self._idle()))
                      .execution_options(synchronize_session=False))
            if replacing and len(replacing) <= _MAX_ID:
                s.execute(delete(DashboardSession).where(DashboardSession.id_hash == id_hash(self.key, replacing))
                          .execution_options(synchronize_session=False))
            s.add(row)
        return session_id, UiSession(row.id_hash, csrf, row.created_at, row.expires_at)

    def find(self, session_id: str | None, *, now: datetime | None = None) -> UiSession | None:
        """The live session a cookie value names, or None (unknown, ended, idle or expired: an
        expired row is deleted on the way). Marks it used."""
        if not session_id or len(session_id) > _MAX_ID:
            return None
        now = now or utcnow()
        with self.store.transaction() as s:
            row = s.get(DashboardSession, id_hash(self.key, session_id))
            if row is None:
                return None
            if now >= row.expires_at or now >= row.last_seen + self._idle():
                s.delete(row)
                return None
            if now - row.last_seen >= TOUCH_EVERY:
                row.last_seen = now
            return UiSession(row.id_hash, row.csrf, row.created_at, row.expires_at)

    def end(self, session_id: str | None) -> bool:
        """Delete the session a cookie value names (logout). True when there was one."""
        if not session_id or len(session_id) > _MAX_ID:
            return False
        with self.store.transaction() as s:
            result = s.execute(delete(DashboardSession).where(DashboardSession.id_hash == id_hash(self.key, session_id))
                               .execution_options(synchronize_session=False))
            return bool(getattr(result, "rowcount", 0))
