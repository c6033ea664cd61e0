"""Token-rate limits: worst-case tokens per key per clock minute (policy ``tokens_per_minute``).

A metered call that produces tokens (rollout chat completions, the agent route) reserves its
worst case — the prompt bound plus ``max_tokens``, times ``n``, as the rollout estimator
bounds it — against the key's counter for the current minute and against each ancestor's
that has a limit, in one transaction: per counter one ``INSERT … ON CONFLICT DO NOTHING``
and one conditional ``UPDATE … SET tokens = tokens + :n WHERE tokens + :n <= :limit`` (like
the ledger), so concurrent calls on any number of gateway replicas never admit more than the
limit, on SQLite and PostgreSQL alike. Counters are taken root first, the same order for every
caller, so two chains never wait on each other in opposite orders.

What is counted is the reserved worst case, not the real usage: a limit is a ceiling on what
a key *may* consume in a minute, never corrected downwards after the call (simpler, and it
can only refuse early, never admit too much). Counters of past minutes are pruned by the
gateway's reaper (:func:`prune`).

Each service has its own counter per key (``<key id>:<service>`` in ``rate_counters.key_id``):
the agent route's tokens (``services.agent.tokens_per_minute``, the research agent's own model)
never use up the key's rollout limit, nor the other way round.

How a route uses it (the gateway's proxy does this for operations with a ``tokens`` estimator)::

    limits = rate_limits.limits_of(principal, "rollout")          # [TokenLimit(key_id, service, n), …]
    await gw.store.call(rate_limits.reserve_tokens, gw.store, limits, worst_case_tokens)
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import CursorResult, delete, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from kit.errors import RateLimited, Unprocessable
from storage.store import Store
from storage.tables import RateCounter, utcnow

_COUNTER_CHARS = 40
"""Length of ``rate_counters.key_id``."""


def minute_of(now: datetime) -> int:
    """Minutes since the epoch: the counter a call at ``now`` counts against."""
    return int(now.timestamp() // 60)


def retry_after_s(now: datetime) -> int:
    """Whole seconds until the next minute starts (at least 1)."""
    return max(1, math.ceil(60 - now.timestamp() % 60))


class TokenLimit(NamedTuple):
    """One key's tokens-per-minute limit on one service (the route's own name: ``rollout``, ``agent``)."""

    key_id: str
    service: str
    tokens_per_minute: int

    @property
    def counter(self) -> str:
        """The counter's name in ``rate_counters.key_id``: one per key and service."""
        return counter_of(self.key_id, self.service)


def counter_of(key_id: str, service: str) -> str:
    name = f"{key_id}:{service}"
    if len(name) > _COUNTER_CHARS:  # key ids are 28 characters, service names short: never in practice
        raise ValueError(f"rate counter name {name!r} is longer than {_COUNTER_CHARS} characters")
    return name


def limits_of(principal: Any, service: str) -> list[TokenLimit]:
    """The limits of every key of the principal's chain that limits ``service``, root first."""
    limits = []
    for key_id, policy in zip(principal.chain_ids, principal.policies, strict=True):
        rules = policy.service(service)
        if rules is not None and rules.tokens_per_minute is not None:
            limits.append(TokenLimit(key_id, service, rules.tokens_per_minute))
    return limits


def reserve_tokens(store: Store, limits: list[TokenLimit], tokens: int, *, now: datetime | None = None) -> None:
    """Count ``tokens`` against every limit of ``limits`` for the current minute, or none of them.

    Raises :class:`RateLimited` (429, ``Retry-After``) when any limit has too few tokens left
    this minute, and :class:`Unprocessable` when one call alone is larger than a limit (it could
    never pass: lower ``max_tokens``)."""
    if not limits:
        return
    now = now or utcnow()
    for limit in limits:
        if tokens > limit.tokens_per_minute:
            raise Unprocessable(f"this call may use up to {tokens} tokens, more than the {limit.tokens_per_minute} "
                                f"tokens per minute this key (or the key it was minted from) allows on "
                                f"{limit.service}; lower max_tokens or the prompt", param="max_tokens")
    minute = minute_of(now)
    with store.transaction() as s:
        for limit in limits:
            s.execute(_insert(s).values(key_id=limit.counter, minute=minute, tokens=0).on_conflict_do_nothing())
            result = s.execute(
                update(RateCounter)
                .where(RateCounter.key_id == limit.counter, RateCounter.minute == minute,
                       RateCounter.tokens + tokens <= limit.tokens_per_minute)
                .values(tokens=RateCounter.tokens + tokens)
                .execution_options(synchronize_session=False))
            if cast(CursorResult[Any], result).rowcount != 1:  # the transaction rolls back every counter
                wait = retry_after_s(now)
                raise RateLimited(f"the {limit.tokens_per_minute} tokens per minute of key {limit.key_id} on "
                                  f"{limit.service} are used up for this minute; retry in {wait} s",
                                  headers={"Retry-After": str(wait)})


def used_tokens(store: Store, key_id: str, service: str = "rollout", *, now: datetime | None = None) -> int:
    """Tokens counted against ``key_id`` on ``service`` in the current minute."""
    with store.transaction() as s:
        row = s.get(RateCounter, (counter_of(key_id, service), minute_of(now or utcnow())))
        return 0 if row is None else int(row.tokens)


def prune(store: Store, *, now: datetime | None = None) -> int:
    """Drop counters of minutes that have passed (the previous minute is kept: harmless)."""
    with store.transaction() as s:
        result = s.execute(delete(RateCounter).where(RateCounter.minute < minute_of(now or utcnow()) - 1)
                           .execution_options(synchronize_session=False))
        return int(cast(CursorResult[Any], result).rowcount)


def _insert(s: Session) -> Any:
    dialect = s.get_bind().dialect.name
    return (pg_insert if dialect == "postgresql" else sqlite_insert)(RateCounter)
