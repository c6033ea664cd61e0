"""Run keys and child keys: creation, authentication, status, budget and policy edits.

A key is shown once at creation and stored only as its SHA-256. Authentication loads the
whole chain (the key and its ancestors). Gateways cache the result briefly
(gateway/principals.py), so every status or policy change is announced once committed
(access/fanout.py): each replica drops the key and its descendants from its cache.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from access.fanout import STATUS_EVENTS
from access.generations import AcceptedSystem, generation_view, generation_views, row_of, start_from
from access.lifecycle import END_REASONS, RunState, run_state, time_left
from access.policy import Policy, ServicePolicy, narrowed
from billing.deadlines import chain_ends_at
from billing.ledger import balance_of, chain_of
from billing.money import nusd_to_usd
from kit.errors import (
    AuthenticationFailed,
    Conflict,
    KeyPaused,
    KeyRevoked,
    NotFound,
    PermissionDenied,
    Unprocessable,
)
from kit.ids import hash_secret, new_api_key, new_id
from storage.store import Store
from storage.tables import ApiKey, utcnow

MAX_CHILD_DEPTH = 4


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key, its run (root key) and the policies of its chain."""

    key_id: str
    run_id: str
    chain_ids: tuple[str, ...]
    policies: tuple[Policy, ...]
    track: str | None
    ends_at: datetime | None = None
    """The run's deadline (billing/deadlines.py): cached with the principal, compared
    with the clock on every call by the gateway."""

    def service_policies(self, service: str) -> list[ServicePolicy]:
        """The chain's rules for one service, root first — what a service needs to know."""
        return [p.services[service] for p in self.policies if service in p.services]

    def max_concurrency(self, service: str) -> list[tuple[str, int]]:
        caps = []
        for key_id, policy in zip(self.chain_ids, self.policies, strict=True):
            rules = policy.service(service)
            if rules is not None and rules.max_concurrency is not None:
                caps.append((key_id, rules.max_concurrency))
        return caps


RUN_FACTS = ("task", "agent", "agent_version", "agent_model")
"""What the launcher records about a run on its key at creation (``run`` of the admin route's body)."""


def state_of(root: ApiKey, *, audited: bool = False, scored: bool = False) -> RunState:
    """The lifecycle state of ``root``'s run (access/lifecycle.py)."""
    return run_state(key_status=root.status, ends_at=root.ends_at, end_reason=root.end_reason,
                     audited=audited, scored=scored, paused_at=root.paused_at, launched=root.agent is not None,
                     started_at=root.started_at)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def key_view(row: ApiKey, chain: list[ApiKey] | None = None) -> dict[str, Any]:
    """The public description of a key (never its hash), with its run's facts and lifecycle state
    (a child key's are its run's). An ended run's remaining budget is ``unspent_usd``: nothing
    can spend it any more."""
    root = chain[0] if chain else row
    view: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "prefix": row.key_prefix,
        "parent_id": row.parent_id,
        "run_id": row.root_id,
        "track": row.track,
        "status": row.status,
        "policy": row.policy,
        "budget_usd": None if row.budget_nusd is None else nusd_to_usd(row.budget_nusd),
        "spent_usd": nusd_to_usd(row.spent_nusd),
        "reserved_usd": nusd_to_usd(row.reserved_nusd),
        "created_at": row.created_at.isoformat(),
        "ends_at": row.ends_at.isoformat() if row.ends_at is not None else None,
        "agent_meter_id": row.agent_meter_id,
        **{fact: getattr(root, fact) for fact in RUN_FACTS},
        "agent_exit": root.agent_exit,
        "started_at": _iso(root.started_at),
        "paused_at": _iso(root.paused_at),
        "time_left_s": time_left(root.ends_at, root.paused_at),
    }
    state = state_of(root)
    view |= {"state": str(state), "state_name": state.state, "end_reason": state.reason, "ended": state.ended}
    if chain is not None:
        view["remaining_usd"] = nusd_to_usd(balance_of(chain).remaining_nusd)
        if view.get("ended"):
            view["unspent_usd"] = view["remaining_usd"]
    return view


def with_progress(view: dict[str, Any], *, audited: bool, scored: bool) -> dict[str, Any]:
    """``view`` with its run's state moved on by what the services know (audited, scored)."""
    if not view["ended"]:
        return view
    state = run_state(key_status="active", ends_at=None, end_reason=view["end_reason"], audited=audited, scored=scored)
    return {**view, "state": str(state), "state_name": state.state}


def _run_key_for_update(s: Session, key_id: str, child_refusal: str) -> ApiKey:
    """The run key ``key_id``, locked for this transaction: 404 if there is none, 409
    (``child_refusal``) for a child key — a run's clock and end are its run key's."""
    row = s.get(ApiKey, key_id, with_for_update=True)
    if row is None:
        raise NotFound(f"key {key_id} not found", param="id")
    if row.parent_id is not None:
        raise Conflict(child_refusal)
    return row


def _clock_change(row: ApiKey, status: str, now: datetime) -> dict[str, Any]:
    """How a run key's clock columns change when its status becomes ``status`` (access/lifecycle.py)."""
    if status == "paused":
        return {} if row.paused_at is not None else {"paused_at": now}
    if row.paused_at is None:
        return {}
    values: dict[str, Any] = {"paused_at": None}
    if status == "active" and row.ends_at is not None and row.end_reason is None and row.ends_at > row.paused_at:
        values["ends_at"] = row.ends_at + (now - row.paused_at)
    return values


class KeyRegistry:
    def __init__(self, store: Store):
        self.store = store

    def create(
        self,
        *,
        policy: Policy,
        budget_nusd: int | None,
        track: str | None = None,
        name: str | None = None,
        parent_id: str | None = None,
        platform: bool = False,
        ends_at: datetime | None = None,
        run: dict[str, str | None] | None = None,
        from_run: str | None = None,
        accepted_system: AcceptedSystem | None = None,
    ) -> tuple[dict[str, Any], str]:
        """Create a key; returns its view and the plaintext key (the only time it exists).

        ``platform``: minted by the gym itself (an evaluation job's keys), which may grant a
        model door; everything else must still be within every ancestor's policy. ``run``: what
        the launcher records of a run key's run (:data:`RUN_FACTS`). ``from_run``: the run key's run
        starts from that run's accepted system (access/generations.py; ``accepted_system`` reads and
        vouches for it): its generation row commits with the key, and a refusal mints nothing."""
        if from_run is not None and (parent_id is not None or accepted_system is None):
            raise Unprocessable("only a run key starts from another run", param="from_run")
        if budget_nusd is not None and budget_nusd < 0:
            raise Unprocessable("budget must be >= 0", param="budget_usd")
        plaintext = new_api_key()
        with self.store.transaction() as s:
            root_id, depth = None, 0
            if parent_id is not None:
                chain = chain_of(s, parent_id)
                parent = chain[-1]
                _require_active(chain)
                if parent.depth + 1 > MAX_CHILD_DEPTH:
                    raise Conflict(f"child keys nest at most {MAX_CHILD_DEPTH} deep")
                policy = narrowed(policy, [Policy.model_validate(k.policy) for k in chain], platform=platform)
                check_record_owners(s, parent, policy)
                root_id, depth, track = parent.root_id, parent.depth + 1, parent.track
            elif budget_nusd is None:
                raise Unprocessable("a run key needs a budget", param="budget_usd")
            key_id = new_id("key")
            row = ApiKey(
                id=key_id,
                root_id=root_id or key_id,
                parent_id=parent_id,
                depth=depth,
                name=name,
                key_hash=hash_secret(plaintext),
                key_prefix=plaintext[:10],
                track=track,
                policy=policy.model_dump(mode="json"),
                budget_nusd=budget_nusd,
                spent_nusd=0,
                reserved_nusd=0,
                status="active",
                ends_at=ends_at if parent_id is None else None,  # a child ends with its run
                **({fact: (run or {}).get(fact) for fact in RUN_FACTS} if parent_id is None else {}),
            )
            s.add(row)
            s.flush()
            if from_run is not None and accepted_system is not None:
                start_from(s, new_run_id=key_id, from_run_id=from_run, accepted_system=accepted_system)
            return {**key_view(row, chain_of(s, key_id)), **generation_view(row_of(s, row.root_id))}, plaintext

    def authenticate(self, plaintext: str | None) -> Principal:
        if not plaintext:
            raise AuthenticationFailed("no API key given: send 'Authorization: Bearer <key>'")
        digest = hash_secret(plaintext)
        with self.store.transaction() as s:
            row = s.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
            if row is None or not hmac.compare_digest(row.key_hash, digest):
                raise AuthenticationFailed("invalid API key")
            return self._principal(s, row)

    def authenticate_id(self, key_id: str) -> Principal:
        """For credentials derived from a key (sandbox access tokens): the key's status and
        policy still apply on every call."""
        with self.store.transaction() as s:
            row = s.get(ApiKey, key_id)
            if row is None:
                raise AuthenticationFailed("invalid access token")
            return self._principal(s, row)

    @staticmethod
    def _principal(s: Session, row: ApiKey) -> Principal:
        chain = chain_of(s, row.id)
        _require_active(chain)
        return Principal(
            key_id=row.id,
            run_id=row.root_id,
            chain_ids=tuple(k.id for k in chain),
            policies=tuple(Policy.model_validate(k.policy) for k in chain),
            track=row.track,
            ends_at=chain_ends_at(chain),
        )

    def get(self, key_id: str, *, within_run: str | None = None) -> dict[str, Any]:
        with self.store.transaction() as s:
            row = s.get(ApiKey, key_id)
            if row is None or (within_run is not None and row.root_id != within_run):
                raise NotFound(f"key {key_id} not found", param="id")
            return {**key_view(row, chain_of(s, key_id)), **generation_view(row_of(s, row.root_id))}

    def list(self, *, parent_id: str | None = None, roots_only: bool = False) -> list[dict[str, Any]]:
        with self.store.transaction() as s:
            stmt = select(ApiKey).order_by(ApiKey.created_at)
            if parent_id is not None:
                stmt = stmt.where(ApiKey.parent_id == parent_id)
            elif roots_only:
                stmt = stmt.where(ApiKey.parent_id.is_(None))
            rows = list(s.scalars(stmt).all())
            generations = generation_views(s, {row.root_id for row in rows})
            return [{**key_view(row, chain_of(s, row.id)), **generations[row.root_id]} for row in rows]

    def set_status(self, key_id: str, status: str, *, parent_id: str | None = None) -> dict[str, Any]:
        """Pause, resume or revoke. Revocation is final. A run key's pause stops its run's wall
        clock; resuming pushes its deadline back by the pause's length (unless the deadline had
        passed before the pause began: a run that ended stays ended)."""
        now = utcnow()
        with self.store.transaction() as s:
            row = s.get(ApiKey, key_id, with_for_update=True)
            if row is None or (parent_id is not None and row.parent_id != parent_id):
                raise NotFound(f"key {key_id} not found", param="id")
            if row.status == "revoked" and status != "revoked":
                raise Conflict("a revoked key cannot be resumed or paused")
            values: dict[str, Any] = {"status": status, "updated_at": now}
            if row.parent_id is None:
                values |= _clock_change(row, status, now)
            s.execute(
                update(ApiKey).where(ApiKey.id == key_id).values(**values)
                .execution_options(synchronize_session=False)
            )
            s.refresh(row)
            view = key_view(row, chain_of(s, key_id))
        self.store.key_events.publish(STATUS_EVENTS[status], key_id)  # committed: now every replica may hear it
        return view

    def start_run(self, key_id: str) -> dict[str, Any]:
        """The launcher's report that the run's agent has started (``created`` → ``running``). The
        wall clock counts from here: a deadline set at creation moves by the time the launch took.
        The first report stands."""
        now = utcnow()
        with self.store.transaction() as s:
            row = _run_key_for_update(s, key_id, "a run starts through its run key; child keys belong to their run")
            if row.started_at is None:
                values: dict[str, Any] = {"started_at": now, "updated_at": now}
                if row.ends_at is not None and row.end_reason is None and row.ends_at > now:
                    values["ends_at"] = row.ends_at + (now - row.created_at)
                s.execute(update(ApiKey).where(ApiKey.id == key_id, ApiKey.started_at.is_(None)).values(**values)
                          .execution_options(synchronize_session=False))
            s.refresh(row)
            view = key_view(row, chain_of(s, key_id))
        self.store.key_events.publish("key.policy", key_id)  # cached principals carry ends_at
        return view

    def topup(self, key_id: str, amount_nusd: int) -> dict[str, Any]:
        if amount_nusd <= 0:
            raise Unprocessable("a top-up must be a positive amount", param="amount_usd")
        with self.store.transaction() as s:
            res = s.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id, ApiKey.budget_nusd.is_not(None), ApiKey.status != "revoked")
                .values(budget_nusd=ApiKey.budget_nusd + amount_nusd, updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            row = s.get(ApiKey, key_id)
            if row is None:
                raise NotFound(f"key {key_id} not found", param="id")
            if cast(CursorResult[Any], res).rowcount != 1:  # SQLAlchemy 2.1 types execute() as Result
                raise Conflict("only an unrevoked key with a budget of its own can be topped up")
            s.refresh(row)
            view = key_view(row, chain_of(s, key_id))
        self.store.key_events.publish("key.topup", key_id)
        return view

    def set_deadline(self, key_id: str, ends_at: datetime | None) -> dict[str, Any]:
        """Set, move or clear (None) a run key's deadline. A deadline moved into the future
        opens an ended run again (a later deadline ends it again)."""
        with self.store.transaction() as s:
            row = s.get(ApiKey, key_id)
            if row is None:
                raise NotFound(f"key {key_id} not found", param="id")
            if row.parent_id is not None:
                raise Conflict("a deadline belongs to the run key; child keys end with their run")
            reopen = ends_at is None or ends_at > utcnow()
            values: dict[str, Any] = {"ends_at": ends_at, "updated_at": utcnow()}
            if reopen:
                values["ended_at"] = None
            s.execute(update(ApiKey).where(ApiKey.id == key_id).values(**values)
                      .execution_options(synchronize_session=False))
            s.refresh(row)
            view = key_view(row, chain_of(s, key_id))
        self.store.key_events.publish("key.policy", key_id)  # cached principals carry ends_at
        return view

    def end_run(self, key_id: str, reason: str, agent_exit: int | None = None) -> dict[str, Any]:
        """End a run now for ``reason`` (the launcher: its agent exited or never started, or the
        operator stopped it): its deadline becomes now unless it has passed already, so its keys
        are refused and the reaper stops its jobs and sandboxes as at any deadline. The first
        recorded end stands (a later report of the same end changes nothing)."""
        if reason not in END_REASONS:
            raise Unprocessable(f"reason must be one of {', '.join(END_REASONS)}", param="reason")
        now = utcnow()
        with self.store.transaction() as s:
            row = _run_key_for_update(s, key_id, "a run ends through its run key; child keys end with their run")
            values: dict[str, Any] = {"updated_at": now}
            if row.ends_at is None or row.ends_at > now:
                values["ends_at"] = now
            if row.end_reason is None:
                values |= {"end_reason": reason, "agent_exit": agent_exit}
            s.execute(update(ApiKey).where(ApiKey.id == key_id).values(**values)
                      .execution_options(synchronize_session=False))
            s.refresh(row)
            view = key_view(row, chain_of(s, key_id))
        self.store.key_events.publish("key.policy", key_id)  # cached principals carry ends_at
        return view

    def set_policy(self, key_id: str, policy: Policy) -> dict[str, Any]:
        with self.store.transaction() as s:
            chain = chain_of(s, key_id)
            if len(chain) > 1:
                policy = narrowed(policy, [Policy.model_validate(k.policy) for k in chain[:-1]])
                check_record_owners(s, chain[-2], policy)
            s.execute(
                update(ApiKey).where(ApiKey.id == key_id)
                .values(policy=policy.model_dump(mode="json"), updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            row = s.get(ApiKey, key_id)
            s.refresh(row)
            view = key_view(row, chain_of(s, key_id))  # type: ignore[arg-type]
        self.store.key_events.publish("key.policy", key_id)
        return view


def subtree_ids(s: Session, roots: list[str], run_id: str) -> set[str]:
    """The keys ``roots`` (those of run ``run_id``) and every key minted below them."""
    found: set[str] = set(s.scalars(select(ApiKey.id).where(ApiKey.id.in_(roots), ApiKey.root_id == run_id)))
    frontier = set(found)
    while frontier:
        children = set(s.scalars(select(ApiKey.id).where(ApiKey.parent_id.in_(frontier)))) - found
        found |= children
        frontier = children
    return found


def readable_keys(s: Session, key: ApiKey) -> set[str] | None:
    """Whose records ``key`` may read: None for a run (root) key, which reads its whole run;
    else its own subtree and the subtrees of the owners its records policy names."""
    if key.parent_id is None:
        return None
    records = Policy.model_validate(key.policy).services.get("records")
    return subtree_ids(s, [key.id, *(records.owners or [] if records else [])], key.root_id)


def check_record_owners(s: Session, parent: ApiKey, policy: Policy) -> None:
    """A child's records ``owners`` must be keys of the parent's run that the parent may read
    itself (a worker cannot mint a key that reads its siblings)."""
    records = policy.services.get("records")
    if records is None or not records.owners:
        return
    param = "services.records.owners"
    same_run = set(s.scalars(select(ApiKey.id).where(ApiKey.id.in_(records.owners),
                                                     ApiKey.root_id == parent.root_id)))
    for owner in records.owners:
        if owner not in same_run:  # one answer for missing keys and other runs' keys
            raise Unprocessable(f"records owner {owner!r} is not a key of this run", param=param)
    readable = readable_keys(s, parent)
    if readable is not None and not set(records.owners) <= readable:
        raise PermissionDenied("records owners must be keys whose records the parent key may read", param=param)


def _require_active(chain: list[ApiKey]) -> None:
    """A key works only while it and every ancestor are active."""
    if any(k.status == "revoked" for k in chain):
        raise KeyRevoked("this key (or the run key it was minted from) has been revoked")
    if any(k.status == "paused" for k in chain):
        raise KeyPaused("this key (or the run key it was minted from) is paused")
