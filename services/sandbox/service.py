"""Sandbox lifecycle: ownership, the live-sandbox cap, metering by the second, timeouts.

Creating a sandbox takes, in this order and all-or-nothing: a live-sandbox slot on every
capped key of the chain (atomic conditional UPDATE, never check-then-create), the first
paid slice of time, and the backend's sandbox. A supervisor thread then pays slice after
slice ahead, ends sandboxes whose timeout ran out, and kills (fail closed) any sandbox
whose next slice the key cannot pay. Every end path settles the time used, gives back the
slot and records why the sandbox ended.

Replicas: a sandbox belongs to the replica of this service that created it (its row's
``replica``). Another replica answers calls for it with 503 ``service_unavailable`` (it cannot
reach it), and ends it only once that replica is dead (services/sandbox/replicas.py): then
:meth:`SandboxService.reap` closes its row, settles its open slice up to the dead replica's last
heartbeat and gives its slot back.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn, cast

import anyio
from sqlalchemy import Table, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from access.keys import KeyRegistry, Principal
from billing.concurrency import ConcurrencySlots
from billing.ledger import Ledger
from billing.money import nusd_to_usd
from kit.errors import (
    BudgetExhausted,
    GymError,
    InvalidRequest,
    NotFound,
    NotSupported,
    PermissionDenied,
    ServiceUnavailable,
    Unprocessable,
    validated,
)
from kit.identity import Identity
from kit.ids import new_id
from kit.spec import ServiceContext
from services.records.events import CALL_REFUSED, SANDBOX_SESSION, EventLog
from services.sandbox import tokens
from services.sandbox.backends.base import SandboxBackend, SandboxSpec
from services.sandbox.door import DOOR_PORT, PREFIXES, DoorServer
from services.sandbox.metering import SliceMeter, nusd_per_second
from services.sandbox.replicas import ReplicaLease
from services.sandbox.schemas import CreateSandbox
from services.sandbox.tables import SandboxRow
from services.sandbox.templates import BuiltTemplates, listed_view
from storage.tables import LedgerEntry, utcnow

log = logging.getLogger("rsigym.sandbox")
ENVD_VERSION = "0.5.2"
"""The daemon protocol level we speak: commands with stdin and close-stdin, default user, multipart uploads."""
SLOT_SERVICE = "sandbox.live"
TICK_S = 0.25


_REACH = select(SandboxRow.run_id, SandboxRow.key_id, SandboxRow.owner_only, SandboxRow.chain_ids,
                SandboxRow.state, SandboxRow.end_reason, SandboxRow.replica).where(SandboxRow.id == bindparam("sid"))
"""What :meth:`SandboxService.owned` reads of a sandbox (a prepared statement: every envd call
asks it)."""
_ENDED = (update(cast(Table, SandboxRow.__table__)).where(SandboxRow.id == bindparam("sid"), SandboxRow.state == "running")
          .values({"state": bindparam("state"), "end_reason": bindparam("reason"), "ended_at": bindparam("ended_at"),
                   "seconds": bindparam("seconds"), "cost_nusd": bindparam("cost_nusd")})
          .returning(SandboxRow.run_id, SandboxRow.key_id, SandboxRow.template))
"""A sandbox's row closed, in one statement (the ORM's load, change and flush cost ~2 ms of each end);
a row another replica closed already (it judged this one dead) is left as it is."""


@dataclass(frozen=True)
class _Reach:
    run_id: str
    key_id: str
    owner_only: bool
    chain_ids: list[str] | None
    state: str
    end_reason: str | None


def reachable(row: SandboxRow | _Reach, identity: Identity) -> bool:
    """A sandbox belongs to the key that created it and that key's ancestors — not to sibling
    keys of the same run (a worker cannot exec into a reviewer's sandbox). A sandbox with a model
    door (an evaluation trial's, made with a platform-minted key) belongs to its creator alone."""
    if row.run_id != identity.run_id:
        return False
    if row.owner_only:
        return row.key_id == identity.key_id
    return identity.key_id in (row.chain_ids or [row.key_id])


def _refuse_unless_reachable(row: SandboxRow | _Reach | None, identity: Identity, sandbox_id: str,
                             running: bool) -> None:
    """404 for a sandbox the caller may not reach (or, with ``running``, one that has ended: the
    message says so only to a caller who may reach it)."""
    if row is None or not reachable(row, identity) or (running and row.state != "running"):
        raise NotFound(f"sandbox {sandbox_id} not found" + (
            f" (it ended: {row.state}, {row.end_reason})"
            if row is not None and reachable(row, identity) and row.state != "running" else ""))


def _gym_judge_key(door: Principal) -> bool:
    """A key that may call rollout and nothing else, below a root key that may open model doors
    (``sandbox.door`` is platform-granted: the gym's operator key has it, a run's root never)."""
    own, root = door.policies[-1], door.policies[0]
    sandbox = root.service("sandbox")
    return len(door.chain_ids) > 1 and set(own.services) == {"rollout"} and sandbox is not None and sandbox.door


@dataclass
class _Live:
    meter: SliceMeter
    lease: str | None
    end_at: float
    reach: _Reach
    """Who may reach the sandbox: fixed at its create (its state here is always "running")."""


class SandboxService:
    def __init__(self, context: ServiceContext, backend: SandboxBackend):
        self.context = context
        self.config = context.config.sandbox
        self.store = context.store
        self.ledger = Ledger(context.store, context.config.ledger)
        self.slots = ConcurrencySlots(context.store)
        self.keys = KeyRegistry(context.store)
        self.backend = backend
        self.started_at = utcnow()
        self.secret = context.internal_secret
        self.events = EventLog(context.store, context.internal_secret)
        self._doors: DoorServer | None = None
        self.built = BuiltTemplates(Path(self.config.build_templates_dir) if self.config.build_templates_dir
                                    else context.data_dir / "sandbox-templates", self.config)
        self.replicas = ReplicaLease(context.store, self.config.replica_lease_s)
        self._renew_at = self._reap_at = 0.0
        """When (monotonic) the lease is renewed and dead replicas' sandboxes are reaped next."""
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="rsigym-sandbox-meter", daemon=True)
        self._supervisor.start()

    # -- lifecycle ---------------------------------------------------------------------

    def recover(self) -> None:
        """At start: take this replica's lease, then reap what dead replicas left running (this
        replica's own earlier life among them) — never a live replica's sandboxes."""
        self._registered()
        self.reap()

    def _registered(self) -> str:
        """This replica's id, its lease taken first (a sandbox row never names a replica without one)."""
        with self._lock:
            return self.replicas.id or self.replicas.register()

    def build_template(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        """Build a Dockerfile into a template, or find it built (services/sandbox/templates.py)."""
        if not any(p.build for p in identity.policies):
            raise PermissionDenied("template builds are for the platform's benchmark registration", param="base")
        build = getattr(self.backend, "build_template", None)
        if build is None:
            raise Unprocessable(f"the {self.backend.name} sandbox backend builds no templates; a task whose "
                                "Dockerfile has RUN needs the local backend", param="dockerfile")
        view = self.built.build(body, build)
        log.info("template %s %s for %s", view["templateID"], "reused" if view["reused"] else "built",
                 identity.key_id)
        return view

    def create(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        req = validated(CreateSandbox, body, what="sandbox request")
        name = req.template_id or self.config.default_template
        template = self.config.template(name) or self.built.get(name)
        if template is None:
            names = ", ".join(t.name for t in self.config.templates)
            raise NotFound(f"template {req.template_id!r} not found; templates: {names}", param="templateID")
        timeout = req.timeout or self.config.default_timeout_s
        if timeout > self.config.max_timeout_s:
            raise Unprocessable(f"timeout over the maximum of {self.config.max_timeout_s} s", param="timeout")
        internet = bool(req.allow_internet_access)
        if internet and not all(p.internet for p in identity.policies):
            raise PermissionDenied("this key's policy gives sandboxes no internet", param="allow_internet_access")

        door_port = None
        if req.rsigym_door is not None:
            if not any(p.door for p in identity.policies):
                raise PermissionDenied("model doors are for the platform's evaluation keys", param="rsigymDoor")
            if self.backend.name != "local":
                raise InvalidRequest("a model door needs the local sandbox backend", param="rsigymDoor")
            if not self.context.settings.gateway_url:
                raise ServiceUnavailable("model doors are unavailable: the gym does not know its own address "
                                         "(RSIGYM_GATEWAY_URL, or `rsigym up`'s --host/--port)")
            self._check_door_key(identity, req.rsigym_door.key, req.rsigym_door.service)
            door_port = DOOR_PORT

        sandbox_id = new_id("sbx")
        with contextlib.ExitStack() as undo:  # every step is undone if a later one fails
            lease = self.slots.acquire(list(identity.concurrency_caps), SLOT_SERVICE,
                                       ttl_s=self._lease_ttl())
            undo.callback(self.slots.release, lease)
            meter = SliceMeter(self.ledger, identity.key_id, tuple(identity.chain_ids), sandbox_id,
                               nusd_per_second(template.usd_per_hour), self.config.slice_s)
            meter.open()
            undo.callback(meter.close)  # before anything ran it settles 0
            spec = SandboxSpec(sandbox_id, template, identity.run_id, dict(req.env_vars), internet,
                               dict(req.metadata), timeout, door_port)
            ref = self.backend.create(spec)
            undo.callback(self.backend.kill, sandbox_id)
            made = self.backend.make_dirs(sandbox_id, [(d.path, d.mode) for d in req.rsigym_dirs]) \
                if req.rsigym_dirs else None
            if req.rsigym_door is not None:
                judge = req.rsigym_door.service == "rollout"
                self.doors.open(sandbox_id, self.backend.door_path(sandbox_id) or "",
                                self.context.settings.gateway_url or "", req.rsigym_door.key,
                                owner=getattr(self.backend, "uid_of", lambda _id: None)(sandbox_id),
                                prefix=PREFIXES[req.rsigym_door.service], capture=judge)
                undo.callback(self.doors.close, sandbox_id)
            replica = self._registered()
            meter.restart_clock()
            now = utcnow()
            row = SandboxRow(
                id=sandbox_id, run_id=identity.run_id, key_id=identity.key_id, chain_ids=list(identity.chain_ids),
                template=template.name, backend=self.backend.name, backend_ref=ref,
                sandbox_metadata=dict(req.metadata), internet=internet, owner_only=door_port is not None,
                state="running", started_at=now,
                end_at=now + timedelta(seconds=timeout), price_nusd_per_s=meter.price_nusd_per_s,
                replica=replica, slot_lease=lease,
            )
            with self.store.transaction() as s:
                s.add(row)
            undo.pop_all()
        with self._lock:
            self._live[sandbox_id] = _Live(meter, lease, time.monotonic() + timeout, _Reach(
                identity.run_id, identity.key_id, door_port is not None, list(identity.chain_ids), "running", None))
        log.info("sandbox %s started for run %s (template %s)", sandbox_id, identity.run_id, template.name)
        view = self.created_view(row)
        if door_port is not None and req.rsigym_door is not None:
            view["rsigymDoorUrl"] = f"http://127.0.0.1:{door_port}{PREFIXES[req.rsigym_door.service].rstrip('/')}"
        if made is not None:
            view["rsigymDirsMade"] = made  # absent before (parents included): each holds only the others
        return view

    def _check_door_key(self, identity: Identity, key: str, service: str = "inference") -> None:
        """The door's key must be a live key of the caller's own run: a door never carries a
        foreign (or made-up) credential to the gateway. A judge door (``rollout``) may also carry
        a key of the gym's own: the judge of an agent's own evaluation is paid by the operator,
        so its key is minted below the operator's root key (services/evaluation/jobs.py) — one
        that may call rollout and nothing else, below a root that itself may open doors (a
        platform grant no run's root has)."""
        try:
            door = self.keys.authenticate(key)
        except GymError:
            door = None
        if door is not None and door.run_id == identity.run_id:
            return
        if door is not None and service == "rollout" and _gym_judge_key(door):
            return
        raise PermissionDenied("the door key must be an active key of this run", param="rsigymDoor.key")

    def judge_calls(self, sandbox_id: str) -> dict[str, Any] | None:
        """What the sandbox's judge door was asked (model and messages, bounded); None without one."""
        return self._doors.captured(sandbox_id) if self._doors is not None else None

    def kill(self, identity: Identity, sandbox_id: str) -> None:
        self.check_owned(identity, sandbox_id)
        self.end(sandbox_id, "killed", "killed by its owner")

    def end_run(self, identity: Identity, run_id: str) -> dict[str, int]:
        """Operator (the run's deadline passed): kill the run's live sandboxes; each is settled
        and recorded like any other end."""
        if not identity.operator:
            raise PermissionDenied("operators only")
        with self.store.transaction() as s:
            ids = list(s.scalars(select(SandboxRow.id).where(SandboxRow.run_id == run_id, SandboxRow.state == "running")))
        killed = 0
        for sandbox_id in ids:
            if sandbox_id in self._live:
                self.end(sandbox_id, "killed", "the run's deadline passed")
                killed += 1
        return {"sandboxes_killed": killed}

    def set_timeout(self, identity: Identity, sandbox_id: str, timeout: int) -> None:
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= self.config.max_timeout_s:
            raise Unprocessable(f"timeout must be 1 … {self.config.max_timeout_s} seconds", param="timeout")
        self.check_owned(identity, sandbox_id)
        with self._lock:
            live = self._live.get(sandbox_id)
            if live is None:
                raise NotFound(f"sandbox {sandbox_id} not found")
            live.end_at = time.monotonic() + timeout
        with self.store.transaction() as s:
            s.execute(update(SandboxRow).where(SandboxRow.id == sandbox_id)
                      .values(end_at=utcnow() + timedelta(seconds=timeout)))

    def end(self, sandbox_id: str, state: str, reason: str) -> None:
        """Stop a sandbox for any reason; settle, give back the slot, record why. Idempotent."""
        with self._lock:
            live = self._live.pop(sandbox_id, None)
        if live is None:
            return
        try:
            if self._doors is not None:
                self._doors.close(sandbox_id)
            self.backend.kill(sandbox_id)
        finally:
            seconds, charged = live.meter.close()
            self.slots.release(live.lease)
            with self.store.transaction() as s:
                ended = s.execute(_ENDED, {"sid": sandbox_id, "state": state, "reason": reason, "ended_at": utcnow(),
                                           "seconds": seconds, "cost_nusd": charged}).first()
                if ended is not None:
                    self._record_session(s, sandbox_id=sandbox_id, run_id=ended.run_id, key_id=ended.key_id,
                                         template=ended.template, seconds=seconds, cost_nusd=charged,
                                         reason=reason, state=state)
        log.info("sandbox %s ended (%s): %.1f s, %d nUSD", sandbox_id, state, seconds, charged)

    def _record_session(self, s: Session, *, sandbox_id: str, run_id: str, key_id: str, template: str,
                        seconds: float, cost_nusd: int, reason: str | None, state: str) -> None:
        """The ended sandbox's ``sandbox.session`` event, in the transaction that ends its row."""
        self.events.append(s, run_id=run_id, kind=SANDBOX_SESSION, key_id=key_id,
                           data={"sandbox_id": sandbox_id, "template": template, "seconds": round(seconds, 3),
                                 "cost_nusd": cost_nusd, "reason": reason, "state": state})

    def _door_refused(self, sandbox_id: str, method: str, path: str, rule: str) -> None:
        """The door refused a request from inside the sandbox: a ``call.refused`` for its run and key."""
        with self.store.transaction() as s:
            row = s.get(SandboxRow, sandbox_id)
            if row is None:
                log.warning("door of %s refused %s %s, but the sandbox has no row", sandbox_id, method, path)
                return
            self.events.append(s, run_id=row.run_id, kind=CALL_REFUSED, key_id=row.key_id,
                               data={"where": "door", "sandbox_id": sandbox_id, "method": method, "path": path,
                                     "status": 403, "error": "permission_denied", "rule": rule})

    def shutdown(self) -> None:
        """Kill every live sandbox and stop the supervisor. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        for sandbox_id in list(self._live):
            try:
                self.end(sandbox_id, "killed", "the gym stopped")
            except GymError as err:
                log.warning("sandbox %s: %s", sandbox_id, err.message)
        self.backend.close()
        if self._doors is not None:
            self._doors.shutdown()
            self._doors = None
        try:
            self.replicas.retire()
        except Exception as err:  # noqa: BLE001 - stopping must not fail: the lease runs out on its own
            log.warning("sandbox replica lease not given back: %s",
                        err.message if isinstance(err, GymError) else type(err).__name__)

    @property
    def doors(self) -> DoorServer:
        with self._lock:
            if self._doors is None:
                self._doors = DoorServer(on_refused=self._door_refused)
            return self._doors

    # -- the supervisor ----------------------------------------------------------------

    def _lease_ttl(self) -> float:
        return self.config.slice_s * 4 + 60

    def _supervise(self) -> None:
        while not self._stop.wait(TICK_S):
            for sandbox_id, live in list(self._live.items()):
                try:
                    self._check(sandbox_id, live)
                except Exception:  # one bad sandbox must not stop metering of the others
                    log.exception("sandbox %s: supervisor error", sandbox_id)
            try:
                self._keep_lease()
            except Exception as err:  # noqa: BLE001 - retried next tick; a lease that runs out is handled there
                log.warning("sandbox replica lease: %s", err.message if isinstance(err, GymError) else type(err).__name__)

    def _keep_lease(self) -> None:
        """Every third of the lease: renew it — or, when it ran out, give up every sandbox (another
        replica may have reaped them) and take a new one — then reap dead replicas' sandboxes."""
        now = time.monotonic()
        if not self.replicas.id or now < self._renew_at:
            return
        third = self.config.replica_lease_s / 3
        self._renew_at = now + third
        if not self.replicas.renew():
            lost = self.replicas.id
            log.warning("sandbox replica %s: its lease ran out; its %d sandboxes end", lost, len(self._live))
            for sandbox_id in list(self._live):
                self.end(sandbox_id, "failed", f"its sandbox replica lost its lease ({lost})")
            with self._lock:
                self.replicas.register()
        if now >= self._reap_at:
            self._reap_at = now + third
            self.reap()

    # -- dead replicas --------------------------------------------------------------------

    def reap(self) -> int:
        """End the rows of sandboxes whose replica is dead (services/sandbox/replicas.py); returns
        how many. Each is taken by one conditional UPDATE, so replicas reaping at once never end a
        sandbox twice; a live replica's sandboxes are never touched."""
        me = self.replicas.id
        with self.store.transaction() as s:
            rows = s.execute(select(SandboxRow.id, SandboxRow.replica).where(
                SandboxRow.state == "running", SandboxRow.backend == self.backend.name,
                or_(SandboxRow.replica.is_(None), SandboxRow.replica != me))).all()
            dead = self.replicas.dead(s, {owner for _, owner in rows}) if rows else {}
        reaped = sum(self._reap_one(sandbox_id, owner, dead[owner]) for sandbox_id, owner in rows if owner in dead)
        self.replicas.forget([owner for owner in dead if owner])
        return reaped

    def _reap_one(self, sandbox_id: str, owner: str | None, last_alive: datetime | None) -> int:
        """Close one dead replica's sandbox: its open slices settled for the time it is known to
        have run (to its replica's last heartbeat; nothing after), its row ended with its totals
        and its ``sandbox.session`` event, its slot given back. 1 if this call ended it."""
        with self.store.transaction() as s:
            row = s.get(SandboxRow, sandbox_id)
            if row is None or row.state != "running" or row.replica != owner:
                return 0
            s.expunge(row)
        known_s = max(0.0, ((last_alive or row.started_at) - row.started_at).total_seconds())
        seconds = self._settle_orphan(sandbox_id, row.price_nusd_per_s, known_s)
        reason = (f"its sandbox replica stopped ({owner or 'unrecorded'}; last heard "
                  f"{last_alive.isoformat(timespec='seconds') if last_alive else 'never'})")
        with self.store.transaction() as s:
            charged = int(s.scalar(select(func.coalesce(func.sum(LedgerEntry.actual_nusd), 0)).where(
                LedgerEntry.ref_id == sandbox_id, LedgerEntry.status.in_(("settled", "expired")))) or 0)
            taken = s.execute(update(SandboxRow).where(
                SandboxRow.id == sandbox_id, SandboxRow.state == "running",
                SandboxRow.replica.is_(None) if owner is None else SandboxRow.replica == owner)
                .values(state="failed", end_reason=reason, ended_at=utcnow(), seconds=seconds, cost_nusd=charged)
                .execution_options(synchronize_session=False))
            if cast(Any, taken).rowcount != 1:
                return 0
            self._record_session(s, sandbox_id=sandbox_id, run_id=row.run_id, key_id=row.key_id,
                                 template=row.template, seconds=seconds, cost_nusd=charged, reason=reason, state="failed")
        self.slots.release(row.slot_lease)
        log.warning("sandbox %s of run %s reaped: %s; %.1f s, %d nUSD", sandbox_id, row.run_id, reason, seconds, charged)
        return 1

    def _settle_orphan(self, sandbox_id: str, price: int, known_s: float) -> float:
        """Close a dead replica's open reservations for the sandbox, oldest first: each charged for
        the time between what is already paid and ``known_s`` (the sandbox's run until its replica's
        last heartbeat), never more than it holds; a slice that had not begun is released. Returns
        the seconds paid in all (``known_s`` for a free template)."""
        with self.store.transaction() as s:
            entries = s.execute(select(LedgerEntry.id, LedgerEntry.status, LedgerEntry.estimate_nusd,
                                       LedgerEntry.actual_nusd)
                                .where(LedgerEntry.ref_id == sandbox_id)
                                .order_by(LedgerEntry.created_at, LedgerEntry.id)).all()
        paid_s = sum(int(actual or 0) for _, status, _, actual in entries if status in ("settled", "expired")) / price \
            if price else 0.0
        for reservation_id, status, estimate, _ in entries:
            if status != "reserved":
                continue
            use_s = min(max(0.0, known_s - paid_s), estimate / price) if price else 0.0
            if use_s * price >= 1:
                self.ledger.settle(reservation_id, math.ceil(use_s * price))
            else:
                self.ledger.release(reservation_id)
            paid_s += use_s
        return round(paid_s, 3) if price else known_s

    def _check(self, sandbox_id: str, live: _Live) -> None:
        now = time.monotonic()
        if not self.backend.alive(sandbox_id):
            reason = getattr(self.backend, "exit_reason", lambda _id: "")(sandbox_id)
            self.end(sandbox_id, "failed", f"the sandbox's first process exited ({reason})")
        elif now >= live.end_at:
            self.end(sandbox_id, "timed_out", "its timeout ran out")
        elif live.meter.due(now, lead_s=2 * TICK_S):
            try:
                live.meter.advance()
                self.slots.extend(live.lease, self._lease_ttl())
            except BudgetExhausted:
                self.end(sandbox_id, "budget_exhausted",
                         f"the key's budget could not pay the next {self.config.slice_s:g} s of sandbox time")
            except GymError as err:  # store trouble: retry until the paid time runs out, then stop
                if now >= live.meter.paid_until:
                    self.end(sandbox_id, "failed", f"its next slice could not be reserved: {err.message}")

    # -- reads -------------------------------------------------------------------------

    def owned(self, identity: Identity, sandbox_id: str, *, running: bool = True) -> SandboxRow:
        """A sandbox the caller may reach, or 404 — a key never learns of sandboxes that are
        not its own (another run's, a sibling key's, an evaluation trial's)."""
        with self.store.transaction() as s:
            row = s.get(SandboxRow, sandbox_id)
            _refuse_unless_reachable(row, identity, sandbox_id, running)
            assert row is not None  # refused above
            s.expunge(row)
            return row

    def check_live(self, identity: Identity, sandbox_id: str, *, running: bool = True) -> bool:
        """:meth:`check_owned` for a sandbox this replica runs, from memory (no store, so safe on an
        event loop): True when answered (a refusal raises), False when the sandbox is not live here
        and :meth:`check_owned` must ask the store."""
        live = self._live.get(sandbox_id)
        if live is None:
            return False
        _refuse_unless_reachable(live.reach, identity, sandbox_id, running)
        return True

    async def check_owned_async(self, identity: Identity, sandbox_id: str) -> None:
        """:meth:`check_owned` from an event loop: from memory for a sandbox live here (no thread
        hop: every envd call asks), else its store read on a worker thread."""
        if not self.check_live(identity, sandbox_id):
            await anyio.to_thread.run_sync(functools.partial(self.check_owned, identity, sandbox_id))

    def check_owned(self, identity: Identity, sandbox_id: str, *, running: bool = True) -> None:
        """:meth:`owned` when the row itself is not needed — every envd call asks it. A sandbox this
        replica runs is answered from memory: who may reach it is fixed at its create, and it is
        running until :meth:`end` takes it out of ``_live`` (before its backend is killed). Any
        other — ended, unknown, another replica's — by one prepared read, no write transaction (no
        writer's turn on SQLite), which also says why it ended."""
        if self.check_live(identity, sandbox_id, running=running):
            return
        row, replica = self._reach_of(sandbox_id)
        _refuse_unless_reachable(row, identity, sandbox_id, running)
        if running and row is not None and replica != self.replicas.id:
            self._refuse_elsewhere(identity, sandbox_id, replica)

    def _reach_of(self, sandbox_id: str) -> tuple[_Reach | None, str | None]:
        """Who may reach a sandbox, from its row (one prepared read), and which replica runs it."""
        with self.store.read() as work:
            found = work.first(_REACH, {"sid": sandbox_id})
        if found is None:
            return None, None
        run_id, key_id, owner_only, chain_ids, state, end_reason, replica = found
        if isinstance(chain_ids, str):  # SQLite hands JSON back as text
            chain_ids = json.loads(chain_ids)
        return _Reach(run_id, key_id, bool(owner_only), chain_ids, state, end_reason), replica

    def _refuse_elsewhere(self, identity: Identity, sandbox_id: str, replica: str | None) -> None:
        """A running sandbox of another replica: 503 while that replica lives (only it can reach
        the sandbox); if it is dead, the sandbox is reaped here and the caller hears that it ended."""
        with self.store.transaction() as s:
            dead = self.replicas.dead(s, {replica})
        if replica not in dead:
            raise ServiceUnavailable(f"sandbox {sandbox_id} runs on another replica of the sandbox service, which "
                                     "this one cannot reach; its calls must go to the replica that created it",
                                     headers={"Retry-After": "1"})
        self._reap_one(sandbox_id, replica, dead[replica])  # (or another replica just did)
        row, _ = self._reach_of(sandbox_id)
        _refuse_unless_reachable(row, identity, sandbox_id, running=True)  # the 404 that says why it ended

    def list(self, identity: Identity, *, running_only: bool = True, metadata: dict[str, str] | None = None,
             limit: int = 1000) -> list[SandboxRow]:
        with self.store.transaction() as s:
            q = select(SandboxRow).where(SandboxRow.run_id == identity.run_id)
            if running_only:
                q = q.where(SandboxRow.state == "running")
            q = q.order_by(SandboxRow.started_at.desc())
            rows = list(s.scalars(q))
            for r in rows:
                s.expunge(r)
        # Ownership is per key (JSON matching differs between SQLite and PostgreSQL): filter here, then limit.
        rows = [r for r in rows if reachable(r, identity)]
        if metadata:
            rows = [r for r in rows if all(r.sandbox_metadata.get(k) == v for k, v in metadata.items())]
        return rows[:limit]

    def templates(self) -> builtins.list[dict[str, Any]]:  # builtins: this class has a list()
        """Every template a create may name: the configured ones, then those built from Dockerfiles."""
        views = [listed_view(t, base=None, created=self.started_at, envd_version=ENVD_VERSION)
                 for t in self.config.templates]
        for tid, base, built_at in self.built.listed():
            template = self.built.get(tid)
            if template is not None:
                views.append(listed_view(template, base=base, created=built_at, envd_version=ENVD_VERSION))
        return views

    def refuse_lifecycle(self, identity: Identity, sandbox_id: str, action: str) -> NoReturn:
        """E2B's pause and resume: the gym's sandboxes run until killed or timed out, metered by the
        second, and are never paused (a paused sandbox would hold its memory and uid unmetered).
        Someone else's or an unknown sandbox is still 404, as on every other route."""
        self.check_owned(identity, sandbox_id)
        raise NotSupported(f"{action} is not supported by the gym's sandboxes: they run until killed or timed "
                           "out; keep one alive with set_timeout, or start a new one", param="sandboxID")

    # -- views -------------------------------------------------------------------------

    def created_view(self, row: SandboxRow) -> dict[str, Any]:
        return {"templateID": row.template, "sandboxID": row.id, "clientID": "rsigym", "envdVersion": ENVD_VERSION,
                "envdAccessToken": tokens.mint(self.secret, row.key_id, row.id), "domain": None,
                "alias": row.template}

    def listed_view(self, row: SandboxRow) -> dict[str, Any]:
        template = self.config.template(row.template)
        return {
            "templateID": row.template, "alias": row.template, "sandboxID": row.id, "clientID": "rsigym",
            "startedAt": row.started_at.isoformat().replace("+00:00", "Z"),
            "endAt": row.end_at.isoformat().replace("+00:00", "Z"),
            "cpuCount": template.cpu_count if template else 1, "memoryMB": template.memory_mb if template else 0,
            "diskSizeMB": template.disk_mb if template else 0, "state": "running", "envdVersion": ENVD_VERSION,
            "metadata": row.sandbox_metadata,
        }

    def detail_view(self, row: SandboxRow) -> dict[str, Any]:
        view = {**self.listed_view(row), "envdAccessToken": tokens.mint(self.secret, row.key_id, row.id),
                "allow_internet_access": row.internet, "domain": None}
        judged = self.judge_calls(row.id)
        if judged is not None:  # a judge door's sandbox: reachable by its creator only (owner_only)
            view["rsigymJudgeCalls"] = judged
        failed = self._doors.failed(row.id) if self._doors is not None else None
        if failed is not None:  # any door's sandbox (its creator only): calls the platform failed
            view["rsigymDoorFailures"] = failed
        return view

    def record_view(self, row: SandboxRow) -> dict[str, Any]:
        """The gym's own view: ended sandboxes too, with what they cost and why they ended."""
        live = self._live.get(row.id)
        seconds, cost = (live.meter.seconds, live.meter.charged_nusd) if live else (row.seconds, row.cost_nusd)
        return {
            "id": row.id, "object": "sandbox", "template": row.template, "state": row.state,
            "end_reason": row.end_reason, "internet": row.internet, "metadata": row.sandbox_metadata,
            "started_at": row.started_at.isoformat(), "end_at": row.end_at.isoformat(),
            "ended_at": row.ended_at.isoformat() if row.ended_at else None, "seconds": round(seconds, 3),
            "cost_usd": nusd_to_usd(cost), "usd_per_hour": row.price_nusd_per_s * 3600 / 1e9,
        }
