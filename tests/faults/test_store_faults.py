"""Scenario 1: the store (PostgreSQL) goes away, blips or stalls in the middle of metered calls.

Each call is caught between its reservation and its settlement (the stand-in provider holds it).
Afterwards: every refused call got ``503 store_unavailable`` in the standard shape and never
reached the provider; the call whose settlement could not be written was not delivered (fail
closed) and its hold was closed by the reaper once its lease expired, billed once; the ledger
sums to what the key spent; nothing is left held; calls succeed again once the store is back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kit.config import LedgerConfig
from kit.settings import StoreSettings
from storage.store import Store
from tests.conftest import PG_URL, admin_headers, bearer, client_for, create_key, gym_config
from tests.faults.conftest import FaultProxy, assert_error_shape, assert_ledger_sound, ledger_figures, until

pytestmark = pytest.mark.postgres

CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "What is 9 + 9?"}], "max_tokens": 4}
LEASE_S = 2.0
"""The gym's reservation TTL in these tests: a hold whose holder could not settle it is closed
by the reaper's first round after this (production default: 900 s, rounds every 30 s)."""


@pytest.fixture
def proxied(make_gym: Any, provider: Any, pg_schema: str) -> Iterator[tuple[Any, FaultProxy, Store]]:
    """An embedded gym whose PostgreSQL store is reached through a :class:`FaultProxy`."""
    proxy = FaultProxy(("127.0.0.1", 5432)).start()
    url = PG_URL.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    store = Store(url, StoreSettings(connect_timeout_s=2, pool_timeout_s=2, statement_timeout_ms=1500), schema=pg_schema)
    store.migrate()
    config = gym_config(provider[0]).model_copy(update={"ledger": LedgerConfig(reservation_ttl_s=LEASE_S)})
    gym = make_gym(store, config)
    direct = Store(PG_URL, StoreSettings(), schema=pg_schema)  # the test's own view of the ledger
    try:
        yield gym, proxy, direct
    finally:
        proxy.stop()
        store.dispose()
        direct.dispose()


def _in_background(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_store_lost_mid_call_fails_closed_and_the_hold_is_reaped(proxied: Any, provider: Any) -> None:
    gym, proxy, direct = proxied
    client = client_for(gym)
    key = create_key(client, 1.0)
    assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"])).status_code == 200
    faults = provider[1]
    faults.delay_s = 1.5
    reached = faults.received
    thread, out = _in_background(lambda: client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"])))
    until("the call reached the provider (reserved, not settled)", lambda: faults.received > reached, 20, poll=0.02)
    proxy.stop()  # the store goes away while the provider works
    thread.join(timeout=60)
    cut = out[0]
    # The answer could not be billed: it is not delivered, and the caller is told why.
    assert_error_shape(cut, 503, "store_unavailable")
    body = cut.json()
    assert "choices" not in body and "18" not in body["error"]["message"]  # the answer (18) is not delivered
    faults.delay_s = 0.0

    reached = faults.received
    for body in (CHAT, {**CHAT, "stream": True}):
        assert_error_shape(client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key["key"])),
                           503, "store_unavailable")
    assert_error_shape(client.get("/v1/balance", headers=bearer(key["key"])), 503, "store_unavailable")
    assert faults.received == reached, "a call reached the provider while the store was down"

    proxy.start()  # the store is back, on the same address
    held = ledger_figures(direct, key["id"])
    assert held["rows"] == {"settled": 1, "reserved": 1}, held  # the cut call's hold: written, never settled
    # The reaper's round (run here on demand, as the gateway runs it every reaper_interval_s)
    # closes it once its lease has expired.
    until("the hold reaped", lambda: client.post("/admin/v1/reclaim", headers=admin_headers()).json()["reservations"],
          timeout=LEASE_S + 10, poll=0.5)
    after = assert_ledger_sound(direct, key["id"])
    # The provider did the work: the expired hold is billed (never unmetered), once.
    assert after["rows"] == {"settled": 1, "expired": 1}, after
    assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"])).json()["choices"][0][
        "message"]["content"] == "18"
    assert_ledger_sound(direct, key["id"])
    assert client.post("/admin/v1/reclaim", headers=admin_headers()).json() == {"reservations": 0, "slots": 0}


def test_backends_terminated_mid_call_settle_once(proxied: Any, provider: Any) -> None:
    """``pg_terminate_backend`` on every connection the gym has open (a failover, an operator's
    kill): the settlement reconnects and is written exactly once; nothing is lost or held."""
    gym, proxy, direct = proxied
    client = client_for(gym)
    key = create_key(client, 1.0)
    assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"])).status_code == 200
    faults = provider[1]
    faults.delay_s = 1.0
    reached = faults.received
    thread, out = _in_background(lambda: client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"])))
    until("the call reached the provider", lambda: faults.received > reached, 20, poll=0.02)
    ports = proxy.upstream_ports()
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            killed = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE client_port = ANY(:ports) AND pid <> pg_backend_pid()"),
                                  {"ports": ports}).scalar()
    finally:
        admin.dispose()
    assert killed and killed >= 1
    thread.join(timeout=60)
    faults.delay_s = 0.0
    answer = out[0]
    assert answer.status_code in (200, 503), answer.text
    if answer.status_code == 503:  # the settlement met a dead connection: the hold is reaped like any other
        assert_error_shape(answer, 503, "store_unavailable")
        until("the hold reaped", lambda: client.post("/admin/v1/reclaim", headers=admin_headers()).json()["reservations"],
              timeout=LEASE_S + 10, poll=0.5)
    f = assert_ledger_sound(direct, key["id"])
    assert sum(f["rows"].values()) == 2 and faults.received == reached + 1  # one row per call, one provider call each
    assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"])).status_code == 200
    assert_ledger_sound(direct, key["id"])


def test_slow_store_is_slower_not_wrong(proxied: Any, provider: Any) -> None:
    """Every byte to and from the store delayed: calls take longer and are billed exactly."""
    gym, proxy, direct = proxied
    client = client_for(gym)
    key = create_key(client, 1.0)
    proxy.delay_s = 0.03
    answers = [client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"])) for _ in range(3)]
    proxy.delay_s = 0.0
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    f = assert_ledger_sound(direct, key["id"])
    assert f["rows"] == {"settled": 3}
    assert f["spent_nusd"] == sum(int(round(float(a.headers["X-RSIGym-Cost-USD"]) * 1e9)) for a in answers)


def test_stalled_store_fails_closed_within_the_statement_timeout(proxied: Any, provider: Any, pg_schema: str) -> None:
    """The key's row is locked by another session (a stuck migration, a long admin transaction):
    the reservation cannot take its hold. The call is refused within ``statement_timeout_ms``
    (503), not left hanging; nothing reaches the provider and nothing is held."""
    gym, _proxy, direct = proxied
    client = client_for(gym)
    key = create_key(client, 1.0)
    reached = provider[1].received
    locker = create_engine(PG_URL, connect_args={"options": f"-csearch_path={pg_schema}"})
    try:
        with locker.connect() as conn, conn.begin():
            conn.execute(text("SELECT id FROM api_keys WHERE id = :k FOR UPDATE"), {"k": key["id"]})
            stalled = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"]))
    finally:
        locker.dispose()
    assert_error_shape(stalled, 503, "store_unavailable")
    assert provider[1].received == reached
    assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key["key"])).status_code == 200
    f = assert_ledger_sound(direct, key["id"])
    assert f["rows"] == {"settled": 1}, f
