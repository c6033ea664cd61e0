"""A run's wall-clock deadline (``api_keys.ends_at`` on the run key).

After it every key of the run is refused with ``run_ended`` (403) at the gateway — checked
against the clock of each call, never cached with the principal — and submissions are refused
by the evaluation service itself. Something acts at the deadline even when no call arrives:
the gateway's reaper claims each expired run once (:func:`claim_expired_runs`, one atomic
``UPDATE … WHERE ended_at IS NULL``, so several replicas never end a run twice) and asks the
services to stop the run's jobs and sandboxes through their own cancel paths
(gateway/run_end.py), which settle or release every hold. Moving the deadline into the future
(admin API) opens the run again and lets a later deadline end it again.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, or_, select, update
from sqlalchemy.orm import Session

from kit.errors import RunEnded, Unprocessable
from storage.store import Store
from storage.tables import ApiKey, utcnow

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1.5d`` → seconds."""
    found = _DURATION.match(text.lower())
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (write e.g. 90s, 30m, 2h, 1d)")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def resolve_ends_at(ends_at: datetime | None, deadline_s: float | None, *, now: datetime | None = None) -> datetime | None:
    """The deadline a request asks for: an absolute ``ends_at`` or ``deadline_s`` from now (not both)."""
    if ends_at is not None and deadline_s is not None:
        raise Unprocessable("give ends_at or deadline_s, not both", param="deadline_s")
    if deadline_s is not None:
        return (now or utcnow()) + timedelta(seconds=deadline_s)
    if ends_at is not None and ends_at.tzinfo is None:
        raise Unprocessable("ends_at needs a time zone (e.g. 2026-12-01T18:00:00Z)", param="ends_at")
    return ends_at


def check_deadline(ends_at: datetime | None, *, now: datetime | None = None) -> None:
    """Refuse with ``run_ended`` once ``ends_at`` has passed."""
    if ends_at is not None and (now or utcnow()) >= ends_at:
        raise RunEnded(f"this run ended at {ends_at.isoformat()} (its wall-clock deadline); every key of the run is "
                       "refused from then on")


def chain_ends_at(chain: list[ApiKey]) -> datetime | None:
    """The earliest deadline of a key chain (the run key's, in practice)."""
    found = [k.ends_at for k in chain if k.ends_at is not None]
    return min(found) if found else None


def run_ends_at(s: Session, run_id: str) -> datetime | None:
    return s.scalar(select(ApiKey.ends_at).where(ApiKey.id == run_id))


def check_run_open(store: Store, run_id: str) -> None:
    """For services: refuse work of a run whose deadline has passed (a call that slipped past
    the gateway's check, or was in flight at the deadline)."""
    with store.transaction() as s:
        ends_at = run_ends_at(s, run_id)
    check_deadline(ends_at)


def check_run_open_in(s: Session, run_id: str) -> None:
    """:func:`check_run_open` inside the caller's transaction, holding the run key's row (``FOR
    UPDATE`` on PostgreSQL; SQLite's writers are serialised already) until it commits: a write
    checked here (a submission) and :func:`end_run_now` cannot interleave, so nothing the check
    let in lands after the run ended."""
    check_deadline(s.scalar(select(ApiKey.ends_at).where(ApiKey.id == run_id).with_for_update()))


def end_run_now(store: Store, run_id: str, *, now: datetime | None = None) -> tuple[datetime | None, bool]:
    """End an open run now (the operator scores it): its deadline becomes now, so the gateway
    refuses its keys with ``run_ended``, submissions close, and the reaper stops its jobs and
    sandboxes as at any deadline. A run that has already ended keeps its deadline. Returns the
    run's deadline and whether this call ended it (None, False: no such run key)."""
    now = now or utcnow()
    open_run = (ApiKey.id == run_id) & ApiKey.parent_id.is_(None) & (ApiKey.ends_at.is_(None) | (ApiKey.ends_at > now))
    with store.transaction() as s:
        result = s.execute(update(ApiKey).where(open_run).values(ends_at=now, updated_at=now)
                           .execution_options(synchronize_session=False))
        ended = cast(CursorResult[Any], result).rowcount == 1
        ends_at = s.scalar(select(ApiKey.ends_at).where(ApiKey.id == run_id, ApiKey.parent_id.is_(None)))
    if ended:
        store.key_events.publish("key.policy", run_id)  # committed: cached principals carry ends_at
    return ends_at, ended


def claim_expired_runs(store: Store, *, now: datetime | None = None) -> list[tuple[str, datetime]]:
    """Runs whose deadline has passed and that nobody has ended yet, each claimed by this
    caller alone: (run id, ends_at)."""
    now = now or utcnow()
    expired = ((ApiKey.parent_id.is_(None)) & ApiKey.ends_at.is_not(None) & (ApiKey.ends_at <= now)
               & ApiKey.ended_at.is_(None)
               # a paused run's clock stands still: only a deadline that passed before the pause ends it
               & or_(ApiKey.paused_at.is_(None), ApiKey.ends_at <= ApiKey.paused_at))
    with store.transaction() as s:
        candidates = s.execute(select(ApiKey.id, ApiKey.ends_at).where(expired)).all()
    claimed: list[tuple[str, datetime]] = []
    for run_id, ends_at in candidates:
        with store.transaction() as s:
            result = s.execute(update(ApiKey).where(ApiKey.id == run_id, expired).values(ended_at=now)
                               .execution_options(synchronize_session=False))
            if cast(CursorResult[Any], result).rowcount == 1 and ends_at is not None:
                claimed.append((run_id, ends_at))
    return claimed


def unclaim(store: Store, run_id: str) -> None:
    """Give a claimed run back (its end could not be carried out): the next reaper pass retries."""
    with store.transaction() as s:
        s.execute(update(ApiKey).where(ApiKey.id == run_id).values(ended_at=None)
                  .execution_options(synchronize_session=False))
