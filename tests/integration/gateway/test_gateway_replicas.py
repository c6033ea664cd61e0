"""Several gateway replicas over one PostgreSQL schema and one Redis: a key revoked, paused or
narrowed through gateway A is refused by gateway B within 1 s, although B caches principals
for 30 s — only the Redis fan-out can explain the refusal.

The gateways are separate OS processes (``rsigym serve gateway``) that start together on a
fresh schema, so they also migrate it concurrently (under the store's advisory lock)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import create_engine, text

from access.fanout import KeyEvent, KeyEvents
from access.keys import Principal
from gateway.principals import PrincipalCache, PrincipalFanout
from kit.settings import GymSettings, PrincipalCacheSettings, RedisSettings, StoreSettings
from ops.builder import build_service
from tests.conftest import ADMIN_TOKEN, IN_CI, PG_URL, TEACHER_ENV, admin_headers, bearer, gym_config
from tests.fakes.servers import free_port, serve
from tests.fakes.tcp_proxy import TcpProxy

REDIS_URL = os.environ.get("RSIGYM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DEADLINE_S = 1.0
"""The issue's functional deadline: a change made on one replica is enforced on every other."""
CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "What is 9 + 9?"}], "max_tokens": 4}
INTERNAL_SECRET = "replicas-internal-secret"


@pytest.fixture(scope="module")
def redis_available() -> bool:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        return True
    except (redis.RedisError, OSError):
        if IN_CI:
            pytest.fail(f"Redis is required in CI but {REDIS_URL} is unreachable")
        return False


def _channel() -> str:
    """A channel of the caller's own: other tests' announcements never reach it."""
    return f"rsigym:test:{secrets.token_hex(6)}"


@pytest.fixture
def channel(redis_available: bool) -> str:
    if not redis_available:
        pytest.skip("Redis not reachable (set CI=true to make this a failure)")
    return _channel()


def _config_toml(api_base: str) -> str:
    models = []
    for name, price_in, price_out in (("teacher", 1.0, 2.0), ("judge", 3.0, 15.0)):
        models.append(f'[[rollout.models]]\nname = "{name}"\nlitellm_model = "openai/{name}"\n'
                      f'api_base = "{api_base}"\napi_key_env = "{TEACHER_ENV}"\n'
                      f"input_usd_per_mtok = {price_in}\noutput_usd_per_mtok = {price_out}\n")
    return "\n".join(models)


def _pg_url(schema: str) -> str:
    return f"{PG_URL}?options=-csearch_path%3D{schema}"


@contextmanager
def gateway_process(tmp: Path, env: dict[str, str], rollout_url: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``rsigym serve gateway`` as its own OS process; yields its URL once /healthz answers."""
    port = free_port()
    log = (tmp / f"gateway-{port}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops.cli.main", "serve", "gateway", "--service", f"rollout={rollout_url}",
         "--port", str(port)],
        env={**env, "RSIGYM_GATEWAY_URL": f"http://127.0.0.1:{port}", "RSIGYM_DATA_DIR": str(tmp / f"gw-{port}")},
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log_dir: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in log_dir.glob("gateway-*.log"))
            pytest.fail(f"gateway process exited with {proc.returncode}:\n{logs}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"gateway at {url} did not become healthy")


def cache_hits(client: httpx.Client) -> float:
    text = client.get("/metrics", headers=admin_headers()).text
    for line in text.splitlines():
        if line.startswith('rsigym_principal_cache_total{result="hit"}'):
            return float(line.split()[-1])
    return 0.0


def refused_within(call: Callable[[], httpx.Response], status: int, error_type: str) -> tuple[float, httpx.Response]:
    """Poll until ``call`` answers ``status``; returns the seconds it took (from before the
    first poll, which starts right after the change's response) and the refusal."""
    started = time.monotonic()
    while True:
        response = call()
        elapsed = time.monotonic() - started
        if response.status_code == status and response.json()["error"]["type"] == error_type:
            print(f"refused ({error_type}) after {elapsed * 1000:.0f} ms")
            return elapsed, response
        if elapsed > 10:
            pytest.fail(f"still {response.status_code} after {elapsed:.1f} s: {response.text[:200]}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, pg_available: bool, redis_available: bool, standin: Any,
             teacher_secret: str) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """Gateways A and B (separate processes, principal cache TTL 30 s) in front of one rollout
    service, all on one fresh PostgreSQL schema, announcing key changes on one Redis channel.
    Shared by this module's tests (each uses keys of its own): starting them takes seconds."""
    if not (pg_available and redis_available):
        pytest.skip("PostgreSQL and Redis needed (set CI=true to make this a failure)")
    tmp = tmp_path_factory.mktemp("replicas")
    schema = f"t_{secrets.token_hex(6)}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    config_path = tmp / "gym.toml"
    config_path.write_text(_config_toml(standin[0]))
    env = {
        **os.environ,
        "RSIGYM_STORE_URL": _pg_url(schema),
        "RSIGYM_CONFIG": str(config_path),
        "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN,
        "RSIGYM_INTERNAL_SECRET": INTERNAL_SECRET,
        "RSIGYM_REDIS_URL": REDIS_URL,
        "RSIGYM_REDIS_KEY_CHANNEL": _channel(),
        "RSIGYM_PRINCIPAL_CACHE_TTL_S": "30",
        "OMP_NUM_THREADS": "1",
    }
    service_settings = GymSettings(data_dir=tmp / "rollout", admin_token=ADMIN_TOKEN,
                                   internal_secret=INTERNAL_SECRET, gateway_url="http://127.0.0.1:9")
    with ExitStack() as stack, pytest.MonkeyPatch.context() as mp:
        mp.setenv(TEACHER_ENV, teacher_secret)  # the rollout service (in this process) reads it per call
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        stack.callback(admin.dispose)

        def drop() -> None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))

        stack.callback(drop)
        rollout_url = stack.enter_context(serve(build_service(
            "rollout", service_settings, gym_config(standin[0]), StoreSettings(url=_pg_url(schema))
        )))
        started = [stack.enter_context(gateway_process(tmp, env, rollout_url)) for _ in range(2)]
        for url, proc in started:
            wait_healthy(url, proc, tmp)
        a, b = (stack.enter_context(httpx.Client(base_url=url, timeout=30)) for url, _ in started)
        yield a, b


def _key(a: httpx.Client, **body: Any) -> dict[str, Any]:
    r = a.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1, **body}, headers=admin_headers())
    assert r.status_code == 201, r.text
    return r.json()


def _warm(client: httpx.Client, key: str) -> None:
    """Two calls: the first fills this replica's cache, the second is answered from it."""
    before = cache_hits(client)
    for _ in range(2):
        assert client.get("/rollout/v1/models", headers=bearer(key)).status_code == 200
    assert cache_hits(client) >= before + 1, "the replica did not answer from its principal cache"


@pytest.mark.slow
@pytest.mark.postgres
def test_revocation_through_a_is_refused_by_b_within_1s(replicas: tuple[httpx.Client, httpx.Client]) -> None:
    a, b = replicas
    run = _key(a)
    child = a.post("/v1/keys", json={"name": "worker"}, headers=bearer(run["key"]))
    assert child.status_code == 201, child.text
    bystander = _key(a)
    for client in (a, b):
        for key in (run["key"], child.json()["key"], bystander["key"]):
            _warm(client, key)

    assert a.post(f"/admin/v1/keys/{run['id']}/revoke", headers=admin_headers()).json()["status"] == "revoked"
    # An unmetered call: only B's authentication (cache or store) can refuse it.
    elapsed, refusal = refused_within(lambda: b.get("/rollout/v1/models", headers=bearer(run["key"])),
                                      401, "key_revoked")
    assert elapsed < DEADLINE_S, f"B refused the revoked key only after {elapsed:.3f} s"
    child_elapsed, _ = refused_within(lambda: b.get("/rollout/v1/models", headers=bearer(child.json()["key"])),
                                      401, "key_revoked")
    assert child_elapsed < DEADLINE_S  # its parent's revocation dropped the child from B's cache too
    assert b.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(run["key"])).status_code == 401
    hits = cache_hits(b)
    assert b.get("/rollout/v1/models", headers=bearer(bystander["key"])).status_code == 200
    assert cache_hits(b) == hits + 1, "an unrelated key's cache entry was dropped too"


@pytest.mark.slow
@pytest.mark.postgres
def test_pause_and_resume_through_a_reach_b_within_1s(replicas: tuple[httpx.Client, httpx.Client]) -> None:
    a, b = replicas
    run = _key(a)
    _warm(b, run["key"])
    assert a.post(f"/admin/v1/keys/{run['id']}/pause", headers=admin_headers()).json()["status"] == "paused"
    elapsed, _ = refused_within(lambda: b.get("/rollout/v1/models", headers=bearer(run["key"])), 403, "key_paused")
    assert elapsed < DEADLINE_S, f"B refused the paused key only after {elapsed:.3f} s"

    assert a.post(f"/admin/v1/keys/{run['id']}/resume", headers=admin_headers()).json()["status"] == "active"
    started = time.monotonic()
    while (r := b.get("/rollout/v1/models", headers=bearer(run["key"]))).status_code != 200:
        assert time.monotonic() - started < 10, r.text
        time.sleep(0.01)
    assert time.monotonic() - started < DEADLINE_S


@pytest.mark.slow
@pytest.mark.postgres
def test_policy_edit_through_a_is_enforced_by_b_within_1s(replicas: tuple[httpx.Client, httpx.Client]) -> None:
    a, b = replicas
    run = _key(a)
    first = b.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(run["key"]))
    assert first.status_code == 200 and first.json()["choices"][0]["message"]["content"] == "18"
    _warm(b, run["key"])

    edited = a.patch(f"/admin/v1/keys/{run['id']}", json={"policy": {"services": {"rollout": {"models": ["judge"]}}}},
                     headers=admin_headers())
    assert edited.status_code == 200, edited.text
    elapsed, refusal = refused_within(lambda: b.post("/rollout/v1/chat/completions", json=CHAT,
                                                     headers=bearer(run["key"])), 403, "permission_denied")
    assert elapsed < DEADLINE_S, f"B still let the now-forbidden model through after {elapsed:.3f} s"
    assert "teacher" in refusal.json()["error"]["message"]
    assert b.post("/rollout/v1/chat/completions", json={**CHAT, "model": "judge"},
                  headers=bearer(run["key"])).status_code == 200


# -- one replica's cache and a Redis that goes away (in-process, real Redis behind a cuttable proxy) --


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_losing_redis_turns_the_cache_off_and_regaining_it_starts_empty(channel: str) -> None:
    host, _, port = REDIS_URL.removeprefix("redis://").partition("/")[0].partition(":")
    proxy = TcpProxy((host, int(port or 6379))).start()
    settings = RedisSettings(url=f"redis://127.0.0.1:{proxy.port}/0", key_channel=channel)
    cache = PrincipalCache(PrincipalCacheSettings(ttl_s=30))
    fanout = PrincipalFanout(cache, KeyEvents(settings), dialect="postgresql")
    someone = Principal(key_id="key_x", run_id="key_x", chain_ids=("key_x",), policies=(), track=None)
    publisher = KeyEvents(RedisSettings(url=REDIS_URL, key_channel=channel))
    try:
        fanout.start()
        _wait(lambda: cache.live, "the subscription")
        assert cache.put("k", someone, cache.begin()) and cache.get("k") is someone
        publisher.publish("key.policy", "key_x")  # through real Redis to the subscriber thread
        _wait(lambda: cache.get("k") is None, "the announcement")

        assert cache.put("k", someone, cache.begin())
        proxy.stop()  # Redis gone: announcements can no longer arrive
        _wait(lambda: not cache.live, "the subscriber to notice the outage")
        assert cache.get("k") is None and not cache.put("k", someone, cache.begin())

        proxy = TcpProxy((host, int(port or 6379)), port=proxy.port).start()
        _wait(lambda: cache.live, "the subscription to come back")
        assert cache.get("k") is None  # anything cached before the outage is gone
    finally:
        fanout.stop()
        proxy.stop()
        publisher.close()
        fanout.events.close()


def test_malformed_announcements_drop_everything(channel: str) -> None:
    cache = PrincipalCache(PrincipalCacheSettings(ttl_s=30))
    fanout = PrincipalFanout(cache, KeyEvents(RedisSettings(url=REDIS_URL, key_channel=channel)), dialect="postgresql")
    someone = Principal(key_id="key_y", run_id="key_y", chain_ids=("key_y",), policies=(), track=None)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        fanout.start()
        _wait(lambda: cache.live, "the subscription")
        cache.put("k", someone, cache.begin())
        client.publish(channel, b"not json")
        _wait(lambda: cache.get("k") is None, "the malformed message to drop the cache")
        assert KeyEvent.decode(KeyEvent("key.revoked", "key_y").encode()) == KeyEvent("key.revoked", "key_y")
        assert KeyEvent.decode(b'{"type":"key.deleted","key_id":"key_y"}') is None
    finally:
        fanout.stop()
        client.close()


def test_threads_are_not_left_running(channel: str) -> None:
    fanout = PrincipalFanout(PrincipalCache(), KeyEvents(RedisSettings(url=REDIS_URL, key_channel=channel)),
                             dialect="postgresql")
    fanout.start()
    _wait(lambda: fanout.cache.live, "the subscription")
    fanout.stop()
    assert not any(t.name == "rsigym-key-fanout" and t.is_alive() for t in threading.enumerate())
