"""The dashboard login's rate limit: failed logins per client address, and for all clients
together, per fixed window (``dashboard_login_failures``).

Each login attempt first *takes* one failure from its address's counter and from the global
one, in one transaction, with the same conditional update as the ledger
(``UPDATE … SET failures = failures + 1 WHERE failures < :limit``): concurrent attempts on any
number of gateway replicas never get past a limit, on SQLite and PostgreSQL alike. An attempt
with the right token gives both back, so only failures count. A full counter answers 429
``rate_limited`` with ``Retry-After`` (the seconds until the window ends) — even for the right
token, or a guesser could go on guessing and learn when it hit.

An address over its limit locks out that address only: the operator's browser elsewhere still
logs in. The global limit is the backstop against a guess spread over many addresses; while it
is full every dashboard login waits for the window's end (the JSON admin API and the CLI, which
send the token in a header, are not affected). The address is the connection's peer as the HTTP
server sees it — never a forwarded header, which the client writes; behind a proxy, configure
the server's trusted proxies (uvicorn ``--forwarded-allow-ips``) so that it is the browser's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, delete, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from access.operator_sessions import LoginFailureCounter
from kit.errors import RateLimited
from ops.dashboard.settings import DashboardSettings
from storage.store import Store
from storage.tables import utcnow

ALL = "all"
_ADDRESS_CHARS = 72


@dataclass(frozen=True, slots=True)
class Attempt:
    """One login attempt's place in the counters (given back when the token was right)."""

    buckets: tuple[str, ...]
    window_no: int


class LoginLimiter:
    def __init__(self, store: Store, settings: DashboardSettings):
        self.store, self.settings = store, settings

    def take(self, address: str, *, now: datetime | None = None) -> Attempt:
        """Count one attempt from ``address``; :class:`RateLimited` when its address or the gym
        has no failures left in this window (nothing is counted then)."""
        now = now or utcnow()
        window_s = self.settings.login_window_s
        window_no = int(now.timestamp()) // window_s
        limits = ((f"addr:{address[:_ADDRESS_CHARS]}", self.settings.login_failures_per_address),
                  (ALL, self.settings.login_failures_total))  # the same order for every caller
        insert_ = pg_insert if self.store.dialect == "postgresql" else sqlite_insert
        with self.store.transaction() as s:
            s.execute(delete(LoginFailureCounter).where(LoginFailureCounter.window_no < window_no - 1)
                      .execution_options(synchronize_session=False))
            for bucket, limit in limits:
                s.execute(insert_(LoginFailureCounter).values(bucket=bucket, window_no=window_no, failures=0)
                          .on_conflict_do_nothing())
                taken = s.execute(
                    update(LoginFailureCounter)
                    .where(LoginFailureCounter.bucket == bucket, LoginFailureCounter.window_no == window_no,
                           LoginFailureCounter.failures < limit)
                    .values(failures=LoginFailureCounter.failures + 1)
                    .execution_options(synchronize_session=False))
                if cast(CursorResult[Any], taken).rowcount != 1:  # the transaction gives the other back
                    wait = max(1, math.ceil((window_no + 1) * window_s - now.timestamp()))
                    who = "from this address" if bucket != ALL else "to this dashboard"
                    raise RateLimited(f"too many failed logins {who}; try again in {wait} s",
                                      headers={"Retry-After": str(wait)})
        return Attempt(tuple(bucket for bucket, _ in limits), window_no)

    def give_back(self, attempt: Attempt) -> None:
        """The attempt succeeded: it is not a failure."""
        with self.store.transaction() as s:
            s.execute(update(LoginFailureCounter)
                      .where(LoginFailureCounter.bucket.in_(attempt.buckets),
                             LoginFailureCounter.window_no == attempt.window_no, LoginFailureCounter.failures > 0)
                      .values(failures=LoginFailureCounter.failures - 1)
                      .execution_options(synchronize_session=False))
