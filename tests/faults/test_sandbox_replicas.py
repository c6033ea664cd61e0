"""Issue 50, item 7a: two sandbox-service replicas never fail each other's sandboxes.

Real processes on one PostgreSQL schema: sandbox replica A (``rsigym serve sandbox``, run in a
UTS namespace of its own under another hostname: another host, as far as replica B can tell),
replica B on this host, and a gateway in this process in front of each.

* A creates a sandbox; B starts (and reaps at start): A's sandbox still runs and answers, and a
  call for it that reaches B is refused with the standard 503 (B cannot reach it) — not failed.
* A is ``kill -9``-ed: once A's lease has run out (not before), B reaps the sandbox's row — ended
  ``failed`` with why, its open slice settled for no more than A was known to run, nothing held,
  the ledger summing to what the key spent, its slot given back, one ``sandbox.session`` event.
* A replica on this host (A2, with a long lease) is ``kill -9``-ed: B knows at once that its
  process is gone and reaps its sandbox without waiting out the lease.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from billing.concurrency import ConcurrencySlots
from kit.settings import GymSettings, StoreSettings
from ops.builder import build_gateway
from services.records.events import SANDBOX_SESSION, RecordEvent
from services.sandbox.service import SLOT_SERVICE, TICK_S
from services.sandbox.tables import SandboxReplica, SandboxRow
from storage.store import Store
from storage.tables import utcnow
from tests.conftest import ADMIN_TOKEN, PG_URL, admin_headers, require_bwrap
from tests.fakes.servers import free_port, serve
from tests.faults.conftest import Procs, assert_error_shape, assert_ledger_sound, until

pytestmark = pytest.mark.postgres

LEASE_S = 3.0
SLICE_S = 2.0
OTHER_HOST = "replica-a-elsewhere"


def _config(path: Path, lease_s: float) -> Path:
    path.write_text(f"[sandbox]\nwarm_pool = 0\nslice_s = {SLICE_S}\nreplica_lease_s = {lease_s}\n")
    return path


class Replicas:
    """The store, the two gateways (to replica A's port and to B's) and a way to start replicas."""

    def __init__(self, store: Store, make_procs: Callable[[dict[str, str]], Procs], env: dict[str, str],
                 tmp: Path, ports: dict[str, int], gateways: dict[str, str]):
        self.store, self.make_procs, self.env, self.tmp = store, make_procs, env, tmp
        self.ports, self.gateways = ports, gateways
        self.procs: dict[str, Procs] = {}

    def start(self, name: str, port: str, lease_s: float, *, host: str | None = None) -> None:
        procs = self.make_procs({**self.env, "RSIGYM_CONFIG": str(_config(self.tmp / f"{name}.toml", lease_s))})
        prefix = ("unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh") if host else ()
        procs.spawn(name, "serve", "sandbox", "--port", str(self.ports[port]), prefix=prefix)
        procs.wait_healthy(name, f"http://127.0.0.1:{self.ports[port]}")
        self.procs[name] = procs

    def kill9(self, name: str) -> datetime:
        before = utcnow()
        self.procs[name].kill9(name)
        return before

    def key(self) -> dict[str, Any]:
        r = httpx.post(f"{self.gateways['a']}/admin/v1/keys", json={"track": "joint", "budget_usd": 1.0},
                       headers=admin_headers(), timeout=30)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def create(self, gateway: str, key: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(f"{self.gateways[gateway]}/sandbox/sandboxes", headers={"X-API-Key": key["key"]},
                       json={"templateID": "base", "timeout": 300}, timeout=60)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def file(self, gateway: str, sbx: dict[str, Any], path: str, data: bytes | None = None) -> httpx.Response:
        """The sandbox daemon's file API through one of the gateways: a write, or a read."""
        headers = {"X-Access-Token": sbx["envdAccessToken"], "E2b-Sandbox-Id": sbx["sandboxID"]}
        url = f"{self.gateways[gateway]}/sandbox/envd/files"
        if data is None:
            return httpx.get(url, params={"path": path}, headers=headers, timeout=30)
        return httpx.post(url, params={"path": path}, content=data, headers=headers, timeout=30)

    def row(self, sandbox_id: str) -> SandboxRow:
        with self.store.transaction() as s:
            row = s.get(SandboxRow, sandbox_id)
            assert row is not None
            s.expunge(row)
            return row

    def leases(self) -> dict[str, str]:
        with self.store.transaction() as s:
            return {r.id: r.host for r in s.scalars(select(SandboxReplica))}

    def sessions(self, run_id: str, sandbox_id: str) -> list[RecordEvent]:
        from services.records.events import EventLog

        events = EventLog(self.store, self.env["RSIGYM_INTERNAL_SECRET"]).events(run_id, kinds=(SANDBOX_SESSION,))
        return [e for e in events if e.data["sandbox_id"] == sandbox_id]


@pytest.fixture
def replicas(tmp_path: Path, pg_schema: str, procs: Any) -> Iterator[Replicas]:
    require_bwrap()
    store_url = f"{PG_URL}?options=-csearch_path%3D{pg_schema}"
    store = Store(store_url, StoreSettings())
    store.migrate()
    ports = {"a": free_port(), "b": free_port()}
    gw_ports = {"a": free_port(), "b": free_port()}
    secret = "replicas-" + secrets.token_hex(8)
    env = {"RSIGYM_DATA_DIR": str(tmp_path / "data"), "RSIGYM_STORE_URL": store_url,
           "RSIGYM_INTERNAL_SECRET": secret, "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN,
           "RSIGYM_GATEWAY_URL": f"http://127.0.0.1:{gw_ports['a']}"}
    gyms = []
    for name in ("a", "b"):
        settings = GymSettings(data_dir=tmp_path / f"gw-{name}", internal_secret=secret, admin_token=ADMIN_TOKEN,
                               gateway_url=f"http://127.0.0.1:{gw_ports[name]}", config=_config(tmp_path / "gw.toml", 30))
        gyms.append(build_gateway(settings, StoreSettings(url=store_url),
                                  {"sandbox": f"http://127.0.0.1:{ports[name]}"}))
    try:
        with serve(gyms[0].app, port=gw_ports["a"]) as url_a, serve(gyms[1].app, port=gw_ports["b"]) as url_b:
            yield Replicas(store, procs, env, tmp_path, ports, {"a": url_a, "b": url_b})
    finally:
        for gym in gyms:
            gym.gateway.context.store.dispose()
        store.dispose()


def _assert_reaped(rep: Replicas, key: dict[str, Any], sbx: dict[str, Any], killed_at: datetime) -> SandboxRow:
    """The dead replica's sandbox ended here with why, billed for no more than it could have run
    (and for no more than its replica was last known alive: what it paid while that replica lived)."""
    row = rep.row(sbx["sandboxID"])
    assert row.state == "failed" and row.end_reason and "sandbox replica stopped" in row.end_reason, row.end_reason
    assert row.ended_at is not None and row.ended_at >= killed_at
    ran_s = (killed_at - row.started_at).total_seconds()
    # paid ahead, a slice is settled whole up to two supervisor ticks before it ends; nothing after the death
    bound_s = ran_s + 2 * TICK_S + 0.05
    assert row.seconds <= bound_s, (row.seconds, ran_s)
    assert row.cost_nusd <= row.price_nusd_per_s * bound_s + 2, (row.cost_nusd, row.price_nusd_per_s, ran_s)
    f = assert_ledger_sound(rep.store, key["id"])  # nothing held, rows sum to what the key spent
    assert f["spent_nusd"] == row.cost_nusd, f
    assert ConcurrencySlots(rep.store).in_flight(key["id"], SLOT_SERVICE) == 0  # its slot is back
    [session] = rep.sessions(key["id"], sbx["sandboxID"])  # recorded once, with what it cost
    assert session.data["state"] == "failed" and session.data["cost_nusd"] == row.cost_nusd
    return row


def test_replicas_never_fail_each_others_sandboxes(replicas: Replicas) -> None:
    rep = replicas
    rep.start("a", "a", LEASE_S, host=OTHER_HOST)
    key = rep.key()
    sbx = rep.create("a", key)
    sid = sbx["sandboxID"]
    assert rep.file("a", sbx, "/home/user/note.txt", b"written through A").status_code == 200
    [a_id] = rep.leases()
    assert a_id.startswith(f"{OTHER_HOST}:") and rep.row(sid).replica == a_id

    # B starts (its start reaps what dead replicas left): A's sandbox still runs and answers
    rep.start("b", "b", LEASE_S)
    assert len(rep.leases()) == 2
    time.sleep(LEASE_S)  # a whole lease of B's reaper rounds, A alive throughout
    assert rep.row(sid).state == "running"
    read = rep.file("a", sbx, "/home/user/note.txt")
    assert read.status_code == 200 and read.content == b"written through A"
    # a call for it that reaches B: refused, standard shape; the sandbox is not touched
    assert_error_shape(rep.file("b", sbx, "/home/user/note.txt"), 503, "service_unavailable")
    killed = httpx.delete(f"{rep.gateways['b']}/sandbox/sandboxes/{sid}", headers={"X-API-Key": key["key"]}, timeout=30)
    assert_error_shape(killed, 503, "service_unavailable")
    assert rep.row(sid).state == "running" and rep.file("a", sbx, "/home/user/note.txt").status_code == 200

    # A dies: its sandbox is reaped by B once A's lease has run out, not before
    killed_at = rep.kill9("a")
    until("A's sandbox reaped", lambda: rep.row(sid).state != "running", 30, poll=0.2)
    row = _assert_reaped(rep, key, sbx, killed_at)
    assert row.end_reason and a_id in row.end_reason
    assert row.cost_nusd > 0  # A lived for slices after the sandbox started: those were paid
    assert row.ended_at is not None
    assert (row.ended_at - killed_at).total_seconds() >= LEASE_S - LEASE_S / 3 - 0.3, (row.ended_at, killed_at)
    until("A's lease forgotten", lambda: a_id not in rep.leases(), 10)
    # a call for it now hears that it ended, from B
    gone = rep.file("b", sbx, "/home/user/note.txt")
    assert_error_shape(gone, 404, "not_found")
    assert "sandbox replica stopped" in gone.json()["error"]["message"]

    # A replica on this host with a long lease dies: B sees its process gone and reaps at once
    rep.start("a2", "a", 120.0)
    key2 = rep.key()
    sbx2 = rep.create("a", key2)
    assert rep.file("a", sbx2, "/home/user/x", b"x").status_code == 200
    killed_at = rep.kill9("a2")
    until("A2's sandbox reaped", lambda: rep.row(sbx2["sandboxID"]).state != "running", 20, poll=0.2)
    _assert_reaped(rep, key2, sbx2, killed_at)

    # B, alive throughout, still holds its lease and serves new sandboxes
    sbx3 = rep.create("b", key2)
    assert rep.file("b", sbx3, "/home/user/y", b"y").status_code == 200
    with rep.store.transaction() as s:
        running = s.scalar(select(func.count()).select_from(SandboxRow).where(SandboxRow.state == "running"))
    assert running == 1
