"""Acceptance: with the store unreachable, metered calls get 503 and the upstream model
receives nothing; when the store returns, nothing was leaked."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from kit.settings import StoreSettings
from storage.store import Store, sqlite_url
from tests.conftest import PG_URL, admin_headers, bearer, client_for, create_key
from tests.fakes.tcp_proxy import TcpProxy

CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _assert_refused(client: httpx.Client, key: str, standin: Any) -> None:
    before = len(standin[1].state.requests)
    for body in (CHAT, {**CHAT, "stream": True}):
        r = client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key))
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "store_unavailable"
        assert r.headers["X-Request-Id"].startswith("req_")
    assert client.get("/v1/balance", headers=bearer(key)).status_code == 503
    assert client.get("/healthz").status_code == 503
    assert len(standin[1].state.requests) == before, "the provider was called while the store was down"


def test_postgres_unreachable_refuses_and_recovers(make_gym: Any, standin: Any, pg_schema: str) -> None:
    proxy = TcpProxy(("127.0.0.1", 5432)).start()
    url = PG_URL.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    store = Store(url, StoreSettings(connect_timeout_s=2, pool_timeout_s=2), schema=pg_schema)
    store.migrate()
    gym = make_gym(store)
    client = client_for(gym)
    try:
        key = create_key(client, 1.0)["key"]
        assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key)).status_code == 200
        proxy.stop()
        _assert_refused(client, key, standin)
        proxy = TcpProxy(("127.0.0.1", 5432), port=proxy.port).start()
        assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key)).status_code == 200
        balance = client.get("/v1/balance", headers=bearer(key)).json()
        assert balance["reserved_usd"] == 0
    finally:
        proxy.stop()
        store.dispose()


@contextmanager
def sqlite_gym(make_gym: Any, data: Path) -> Iterator[tuple[Any, Callable[[], Any]]]:
    """A gym on a SQLite store with a short busy timeout, and a way to lock that database
    from another connection, as another process holding it would."""
    store = Store(sqlite_url(data), StoreSettings(sqlite_busy_timeout_ms=200))
    store.migrate()

    @contextmanager
    def locked() -> Iterator[None]:
        holder = sqlite3.connect(data / "gym.sqlite3", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    try:
        yield client_for(make_gym(store)), locked
    finally:
        store.dispose()


def test_sqlite_locked_store_refuses(make_gym: Any, standin: Any, tmp_path: Path) -> None:
    with sqlite_gym(make_gym, tmp_path / "locked") as (client, locked):
        key = create_key(client, 1.0)["key"]
        with locked():
            _assert_refused(client, key, standin)
        assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key)).status_code == 200


def test_admin_routes_fail_closed_too(make_gym: Any, tmp_path: Path) -> None:
    with sqlite_gym(make_gym, tmp_path / "locked-admin") as (client, locked), locked():
        r = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1}, headers=admin_headers())
        assert r.status_code == 503 and r.json()["error"]["type"] == "store_unavailable"
