"""Timestamps of the admin API's rows (ISO 8601) as hours since a run started."""

from __future__ import annotations

from datetime import UTC, datetime


def parse(value: str | None) -> datetime | None:
    if not value:
        return None
    at = datetime.fromisoformat(value)
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def run_start(key: dict[str, object]) -> datetime | None:
    """When the run's research began: its agent's start as the launcher reported it, else the run
    key's creation (a key minted by hand)."""
    return parse(str(key.get("started_at") or "")) or parse(str(key.get("created_at") or ""))


def hours_since(start: datetime, value: str | None) -> float | None:
    at = parse(value)
    return None if at is None else (at - start).total_seconds() / 3600.0
