"""Sandbox-service replicas: which one runs which sandbox, and which are alive.

A sandbox lives in the replica that created it — its processes, its meter, its door are in that
process — so only that replica may end it, until that replica is dead. Each replica holds a lease
row (``sandbox_replicas``) that it renews every third of ``[sandbox] replica_lease_s``, and each
sandbox row names its replica. A replica is dead when

* its lease ran out (its host stopped, or its process froze or lost the store for a whole lease:
  hosts' clocks are assumed NTP-close, as for job heartbeats), or
* it ran on this host and its process is gone (``kill -9``, a crash, the replica itself
  restarted): known at once, without waiting out the lease. "This host" is the hostname, boot id
  and PID namespace together, so two containers that share a hostname never judge each other's
  pids.

At start and every third of the lease each replica reaps the sandboxes of dead replicas
(:meth:`services.sandbox.service.SandboxService.reap`), never a live one's. A lease that ran out
is never renewed: a replica that finds its own expired (it was, or may have been, judged dead)
ends its sandboxes at once — their meters were settled by whoever reaped them — and takes a
fresh lease under a new id.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, delete, or_, select, update
from sqlalchemy.orm import Session

from kit.host_uids import pid_running
from services.sandbox.tables import SandboxReplica, SandboxRow
from storage.store import Store
from storage.tables import utcnow

LIVE_HERE: set[str] = set()
"""Ids of the replicas running in this process (tests build several gyms in one)."""


def host_identity() -> str:
    """Where a pid means one process: hostname / boot id / PID namespace."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8])
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]"))
    return "/".join(parts)[:200]


class ReplicaLease:
    """This replica's lease, and the judgement of others'."""

    def __init__(self, store: Store, lease_s: float):
        self.store = store
        self.lease_s = lease_s
        self.host = host_identity()
        self.pid = os.getpid()
        self.id = ""
        """Empty until :meth:`register`."""

    def register(self) -> str:
        """Take a fresh lease under a new id (the first, or after this one ran out)."""
        self.retire()
        new = f"{socket.gethostname()[:80]}:{self.pid}:{uuid.uuid4().hex[:8]}"
        now = utcnow()
        with self.store.transaction() as s:
            s.add(SandboxReplica(id=new, host=self.host, pid=self.pid, started_at=now, heartbeat_at=now,
                                 expires_at=now + timedelta(seconds=self.lease_s)))
        LIVE_HERE.add(new)
        self.id = new  # only once its lease is stored: a sandbox row never names a replica without one
        return new

    def renew(self) -> bool:
        """Renew the lease; False when it had run out (or was taken back): this replica may have
        been judged dead, and must give up what it runs."""
        now = utcnow()
        t = SandboxReplica
        with self.store.transaction() as s:
            done = s.execute(update(t).where(t.id == self.id, t.expires_at >= now)
                             .values(heartbeat_at=now, expires_at=now + timedelta(seconds=self.lease_s))
                             .execution_options(synchronize_session=False))
            return cast(CursorResult[Any], done).rowcount == 1

    def retire(self) -> None:
        """Give the lease back (shutdown: every sandbox of this replica has ended)."""
        if not self.id:
            return
        old, self.id = self.id, ""
        LIVE_HERE.discard(old)
        with self.store.transaction() as s:
            s.execute(delete(SandboxReplica).where(SandboxReplica.id == old))

    def dead(self, session: Session, owners: set[str | None]) -> dict[str | None, datetime | None]:
        """Of ``owners`` (sandbox rows' replicas), the dead ones, each with the last time it was
        known alive (its last heartbeat; None: never known — a row from before replicas, or a
        lease already forgotten)."""
        ids = [o for o in owners if o]
        leases = {r.id: r for r in session.scalars(select(SandboxReplica).where(SandboxReplica.id.in_(ids)))} \
            if ids else {}
        now = utcnow()
        dead: dict[str | None, datetime | None] = {}
        for owner in owners:
            if owner is not None and owner == self.id:
                continue
            lease = leases.get(owner) if owner else None
            if lease is None:
                dead[owner] = None
            elif lease.expires_at < now or self._gone_here(lease):
                dead[owner] = lease.heartbeat_at
        return dead

    def _gone_here(self, lease: SandboxReplica) -> bool:
        if lease.host != self.host:
            return False
        if lease.pid == self.pid:  # this very process: an earlier life of it (a reused pid), or a gym beside it
            return lease.id not in LIVE_HERE
        return not pid_running(lease.pid)

    def forget(self, replica_ids: list[str]) -> None:
        """Drop the leases of dead replicas whose sandboxes have been reaped, and any lease that
        ran out a whole lease ago and runs nothing."""
        now = utcnow()
        t = SandboxReplica
        running = select(SandboxRow.replica).where(SandboxRow.state == "running", SandboxRow.replica.is_not(None))
        with self.store.transaction() as s:
            if replica_ids:
                s.execute(delete(t).where(t.id.in_(replica_ids), or_(t.expires_at < now, t.host == self.host),
                                          t.id.not_in(running)).execution_options(synchronize_session=False))
            s.execute(delete(t).where(t.expires_at < now - timedelta(seconds=self.lease_s), t.id.not_in(running))
                      .execution_options(synchronize_session=False))
