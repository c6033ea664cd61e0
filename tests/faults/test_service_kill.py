"""Scenario 2: a service process is ``kill -9``-ed in the middle of a request (distributed mode:
the rollout service is its own ``rsigym serve rollout`` process behind the gateway).

* Killed before it answered (the provider was still holding the call): the caller gets the
  standard ``503 service_unavailable``; the reservation is released, nothing is charged.
* Killed in the middle of a streamed answer (status 200 already sent): the stream ends with a
  standard error event (``service_unavailable``) instead of just breaking off, and the call is
  billed its reservation once — the upper bound it was shown in ``X-RSIGym-Cost-USD`` — as a
  stream the provider broke off is (tests/security/test_rollout_settlement.py): the gateway
  cannot know what the dead service had consumed, and a delivered stream is never unmetered.

Either way no hold is left, the ledger sums to what the key spent, and the gateway serves the
next call as soon as the service is back (and refuses cleanly, fast, while it is not).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from billing.money import usd_to_nusd
from kit.settings import GymSettings, StoreSettings
from ops.builder import build_gateway
from storage.store import Store
from tests.conftest import ADMIN_TOKEN, PG_URL, TEACHER_ENV, admin_headers, bearer
from tests.fakes.servers import free_port, serve
from tests.faults.conftest import PASSAGE_CHAT, Procs, assert_error_shape, assert_ledger_sound, rollout_toml, until

pytestmark = pytest.mark.postgres


class Split:
    """A gateway in this process in front of a rollout service in its own process."""

    def __init__(self, url: str, procs: Procs, rollout_port: int, store: Store):
        self.url, self.procs, self.rollout_port, self.store = url, procs, rollout_port, store
        self.client = httpx.Client(base_url=url, timeout=60)

    def start_rollout(self) -> None:
        self.procs.spawn("rollout", "serve", "rollout", "--port", str(self.rollout_port))
        self.procs.wait_healthy("rollout", f"http://127.0.0.1:{self.rollout_port}")

    def key(self) -> dict[str, Any]:
        r = self.client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1.0}, headers=admin_headers())
        assert r.status_code == 201, r.text
        return dict(r.json())


@pytest.fixture
def split(tmp_path: Path, provider: Any, teacher_secret: str, pg_schema: str, procs: Any) -> Iterator[Split]:
    store_url = f"{PG_URL}?options=-csearch_path%3D{pg_schema}"
    store = Store(store_url, StoreSettings())
    store.migrate()
    config = tmp_path / "gym.toml"
    config.write_text(rollout_toml(provider[0], TEACHER_ENV))
    gateway_port, rollout_port = free_port(), free_port()
    env = {"RSIGYM_DATA_DIR": str(tmp_path / "data"), "RSIGYM_CONFIG": str(config), "RSIGYM_STORE_URL": store_url,
           "RSIGYM_INTERNAL_SECRET": "faults-" + secrets.token_hex(8), "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN,
           "RSIGYM_GATEWAY_URL": f"http://127.0.0.1:{gateway_port}", TEACHER_ENV: teacher_secret}
    p = procs(env)
    settings = GymSettings(data_dir=tmp_path / "gw", config=config, internal_secret=env["RSIGYM_INTERNAL_SECRET"],
                           admin_token=ADMIN_TOKEN, gateway_url=env["RSIGYM_GATEWAY_URL"])
    gym = build_gateway(settings, StoreSettings(url=store_url), {"rollout": f"http://127.0.0.1:{rollout_port}"})
    try:
        with serve(gym.app, port=gateway_port) as url:
            s = Split(url, p, rollout_port, store)
            s.start_rollout()
            yield s
            s.client.close()
    finally:
        store.dispose()


def test_service_killed_before_it_answers(split: Split, provider: Any) -> None:
    key = split.key()
    faults = provider[1]
    faults.delay_s = 5.0  # the provider holds the call; the service waits on it
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(split.client.post(
        "/rollout/v1/chat/completions", json=PASSAGE_CHAT, headers=bearer(key["key"]))), daemon=True)
    thread.start()
    until("the call reached the provider", lambda: faults.received == 1, 30, poll=0.05)
    reserved = split.client.get("/v1/balance", headers=bearer(key["key"])).json()
    assert reserved["reserved_usd"] > 0  # between reserve and settle
    split.procs.kill9("rollout")
    thread.join(timeout=30)
    assert out, "the caller was left hanging"
    assert_error_shape(out[0], 503, "service_unavailable")
    f = assert_ledger_sound(split.store, key["id"])
    assert f["rows"] == {"released": 1} and f["spent_nusd"] == 0, f  # not charged the hold
    faults.delay_s = 0.0

    # While the service is down: refused at once, nothing held; once it is back: served.
    assert_error_shape(split.client.post("/rollout/v1/chat/completions", json=PASSAGE_CHAT, headers=bearer(key["key"])),
                       503, "service_unavailable")
    split.start_rollout()
    ok = split.client.post("/rollout/v1/chat/completions", json=PASSAGE_CHAT, headers=bearer(key["key"]))
    assert ok.status_code == 200, ok.text
    f = assert_ledger_sound(split.store, key["id"])
    assert f["rows"] == {"released": 2, "settled": 1} and f["spent_nusd"] == usd_to_nusd(float(ok.headers["X-RSIGym-Cost-USD"]))


def test_service_killed_mid_stream(split: Split, provider: Any) -> None:
    key = split.key()
    events: list[str] = []
    with split.client.stream("POST", "/rollout/v1/chat/completions", json={**PASSAGE_CHAT, "stream": True},
                             headers=bearer(key["key"])) as stream:
        assert stream.status_code == 200
        upper_bound = usd_to_nusd(float(stream.headers["X-RSIGym-Cost-USD"]))
        lines = stream.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                events.append(line)
            if len(events) == 4:  # a few tokens delivered; the service is still generating
                split.procs.kill9("rollout")
                break
        events.extend(line for line in lines if line.startswith("data: "))  # the rest, until the gateway ends it
    payloads = [json.loads(e[len("data: "):]) for e in events if e.startswith("data: {")]
    assert not any("usage" in p and p.get("choices") == [] for p in payloads)  # it never finished
    error = payloads[-1].get("error")
    assert error is not None and error["type"] == "service_unavailable", payloads[-1]
    f = assert_ledger_sound(split.store, key["id"])
    assert f["rows"] == {"settled": 1} and f["spent_nusd"] == upper_bound, f  # billed once, at the bound shown

    split.start_rollout()
    with split.client.stream("POST", "/rollout/v1/chat/completions", json={**PASSAGE_CHAT, "stream": True},
                             headers=bearer(key["key"])) as stream:
        text = stream.read().decode()
    assert stream.status_code == 200 and text.rstrip().endswith("data: [DONE]")
    f = assert_ledger_sound(split.store, key["id"])
    assert f["rows"] == {"settled": 2} and upper_bound < f["spent_nusd"] < 2 * upper_bound, f
