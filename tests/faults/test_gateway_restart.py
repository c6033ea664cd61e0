"""Scenario 4: the gateway process is ``kill -9``-ed between the reservation and the settlement of
a streamed call, and a new gateway starts on the same store.

The dead gateway's hold stays ``reserved`` in the store (nobody can settle it: the stream's cost
trailer went to a dead process). The new gateway's reaper closes it once its lease is over —
within ``ledger.reservation_ttl_s + ledger.reaper_interval_s`` of the reservation (here 10 + 1 s;
production defaults 900 + 30 s) — billing the estimate (``expired_reservations = "charge"``: the
service did the work, so it is never unmetered), once. Then the ledger reconciles (the rows sum
to what the key spent, nothing held) and the new gateway serves the run.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from billing.money import usd_to_nusd
from kit.config import load_config
from kit.settings import GymSettings, StoreSettings
from ops.builder import build_service
from storage.store import Store
from tests.conftest import ADMIN_TOKEN, PG_URL, TEACHER_ENV, admin_headers, bearer
from tests.fakes.servers import free_port, serve
from tests.faults.conftest import PASSAGE_CHAT, Procs, assert_ledger_sound, ledger_figures, rollout_toml, until

pytestmark = pytest.mark.postgres

TTL_S, REAPER_S = 10.0, 1.0


@pytest.fixture
def gateway_proc(tmp_path: Path, provider: Any, teacher_secret: str, pg_schema: str, procs: Any,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Procs, str, Store, tuple[str, ...]]]:
    store_url = f"{PG_URL}?options=-csearch_path%3D{pg_schema}"
    store = Store(store_url, StoreSettings())
    store.migrate()
    config = tmp_path / "gym.toml"
    config.write_text(rollout_toml(provider[0], TEACHER_ENV,
                                   f"[ledger]\nreservation_ttl_s = {TTL_S}\nreaper_interval_s = {REAPER_S}\n"))
    port = free_port()
    secret = "faults-" + secrets.token_hex(8)
    monkeypatch.setenv(TEACHER_ENV, teacher_secret)
    settings = GymSettings(data_dir=tmp_path / "svc", config=config, internal_secret=secret, admin_token=ADMIN_TOKEN,
                           gateway_url=f"http://127.0.0.1:{port}")
    rollout = build_service("rollout", settings, load_config(config), StoreSettings(url=store_url))
    try:
        with serve(rollout) as rollout_url:
            p = procs({"RSIGYM_DATA_DIR": str(tmp_path / "gw"), "RSIGYM_CONFIG": str(config),
                       "RSIGYM_STORE_URL": store_url, "RSIGYM_INTERNAL_SECRET": secret,
                       "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN, "RSIGYM_GATEWAY_URL": f"http://127.0.0.1:{port}"})
            args = ("serve", "gateway", "--service", f"rollout={rollout_url}", "--port", str(port))
            p.spawn("gateway-1", *args)
            url = f"http://127.0.0.1:{port}"
            p.wait_healthy("gateway-1", url)
            yield p, url, store, args
    finally:
        store.dispose()


def test_gateway_killed_between_reserve_and_settle(gateway_proc: Any) -> None:
    p, url, store, args = gateway_proc
    client = httpx.Client(base_url=url, timeout=60)
    key = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1.0}, headers=admin_headers()).json()
    warm = client.post("/rollout/v1/chat/completions", json=PASSAGE_CHAT, headers=bearer(key["key"]))
    assert warm.status_code == 200, warm.text
    delivered = 0
    with pytest.raises(httpx.HTTPError):  # noqa: PT012 - the stream breaks where the gateway dies
        with client.stream("POST", "/rollout/v1/chat/completions", json={**PASSAGE_CHAT, "stream": True},
                           headers=bearer(key["key"])) as stream:
            upper_bound = usd_to_nusd(float(stream.headers["X-RSIGym-Cost-USD"]))
            lines = stream.iter_lines()
            for line in lines:
                delivered += line.startswith("data: {")
                if delivered == 3:
                    p.kill9("gateway-1")
                    killed_at = time.monotonic()
                    break
            for line in lines:  # what was on its way, then the broken connection
                assert "[DONE]" not in line
    assert delivered == 3
    held = ledger_figures(store, key["id"])
    assert held["rows"] == {"settled": 1, "reserved": 1} and held["reserved_nusd"] == upper_bound, held

    p.spawn("gateway-2", *args)  # same store, same address
    p.wait_healthy("gateway-2", url)
    until("the dead gateway's hold reaped by the new one",
          lambda: ledger_figures(store, key["id"])["rows"].get("reserved", 0) == 0, timeout=TTL_S + REAPER_S + 30)
    reaped_after = time.monotonic() - killed_at
    print(f"\nhold of the killed gateway closed {reaped_after:.1f} s after the kill "
          f"(documented bound: reservation_ttl_s {TTL_S} + reaper_interval_s {REAPER_S}, plus the restart)")
    f = assert_ledger_sound(store, key["id"])
    assert f["rows"] == {"settled": 1, "expired": 1}, f
    assert f["spent_nusd"] == usd_to_nusd(float(warm.headers["X-RSIGym-Cost-USD"])) + upper_bound  # billed once

    again = client.post("/rollout/v1/chat/completions", json=PASSAGE_CHAT, headers=bearer(key["key"]))
    assert again.status_code == 200, again.text
    balance = client.get("/v1/balance", headers=bearer(key["key"])).json()
    f = assert_ledger_sound(store, key["id"])
    assert balance["reserved_usd"] == 0 and usd_to_nusd(balance["spent_usd"]) == f["spent_nusd"]
    client.close()
