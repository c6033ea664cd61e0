"""Dashboard settings (env prefix ``RSIGYM_DASHBOARD_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DashboardSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RSIGYM_DASHBOARD_", extra="ignore")

    session_ttl_s: int = Field(default=12 * 3600, gt=0)
    """How long a UI login lasts (RSIGYM_DASHBOARD_SESSION_TTL_S)."""
    refresh_s: int = Field(default=15, ge=0)
    """Pages reload themselves this often; 0 turns auto-refresh off (RSIGYM_DASHBOARD_REFRESH_S)."""
    secure_cookie: bool = False
    """Mark the session cookie Secure even on plain http (a TLS proxy in front); https requests
    always get a Secure cookie."""
    page_rows: int = Field(default=200, gt=0)
    """At most this many rows per table (ledger, jobs, scores)."""
