"""Dashboard settings (env prefix ``RSIGYM_DASHBOARD_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DashboardSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RSIGYM_DASHBOARD_", extra="ignore")

    session_ttl_s: int = Field(default=12 * 3600, gt=0)
    """How long a UI login lasts at most, however busy (RSIGYM_DASHBOARD_SESSION_TTL_S)."""
    session_idle_s: int = Field(default=3600, gt=0)
    """A session unused this long ends (RSIGYM_DASHBOARD_SESSION_IDLE_S); an open page that
    refreshes itself keeps it in use."""
    refresh_s: int = Field(default=15, ge=0)
    """Pages reload themselves this often; 0 turns auto-refresh off (RSIGYM_DASHBOARD_REFRESH_S)."""
    secure_cookie: bool = False
    """Mark the session cookie Secure even on plain http (a TLS proxy in front); https requests
    always get a Secure cookie."""
    page_rows: int = Field(default=200, gt=0)
    """At most this many rows per table (ledger, jobs, scores)."""
    login_window_s: int = Field(default=300, gt=0)
    """The window failed logins are counted in (RSIGYM_DASHBOARD_LOGIN_WINDOW_S)."""
    login_failures_per_address: int = Field(default=10, gt=0)
    """Failed logins one client address may make per window; then 429 until the window ends."""
    login_failures_total: int = Field(default=100, gt=0)
    """Failed logins from all addresses together per window; then every login is 429 until the
    window ends (a guess spread over many addresses). The JSON admin API is not affected."""
