"""SQL tables of the operator's dashboard logins (ops/dashboard/session.py, login_limit.py).

Kept in the store, not in a process, so every gateway replica sees the same sessions and the
same failure counts: a logout on one replica ends the session on all of them, and a brute force
spread over replicas meets one limit.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from storage.tables import Base, UTCDateTime


class DashboardSession(Base):
    """One logged-in browser. The row holds the HMAC of the session id (the cookie's value),
    never the id itself: a reader of the store learns no cookie that opens the dashboard."""

    __tablename__ = "dashboard_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    csrf: Mapped[str] = mapped_column(String(64))
    """The session's CSRF token: pages carry it, state-changing form posts must send it back."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    """Last use (rewritten at most once a minute); the idle expiry counts from it."""
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    """The absolute expiry: the session ends then however busy it is."""


class LoginFailureCounter(Base):
    """Failed dashboard logins in one fixed window, per client address (``addr:<ip>``) and for
    all clients together (``all``)."""

    __tablename__ = "dashboard_login_failures"
    __table_args__ = (CheckConstraint("failures >= 0", name="failures_nonneg"),)

    bucket: Mapped[str] = mapped_column(String(80), primary_key=True)
    window_no: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    """The window: seconds since the epoch // the window's length."""
    failures: Mapped[int] = mapped_column(Integer, default=0)
