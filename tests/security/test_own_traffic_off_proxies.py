"""The gym's calls to itself never go through the egress proxy the environment names
(kit/no_proxy.py).

The attacker here is the proxy, or whoever reads its logs. An operator points ``HTTP_PROXY``,
``HTTPS_PROXY`` and ``ALL_PROXY`` at the lab's egress proxy, so that provider calls can leave.
Run keys, sandbox keys and signed identities must still never reach that proxy, and the gym must
keep working.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pyqwest import HTTPTransport as ReqwestTransport
from pyqwest.httpx import AsyncPyqwestTransport

from kit.no_proxy import PROXY_VARIABLES, keep_off_proxies
from kit.settings import GymSettings, StoreSettings
from ops.builder import build_gateway
from tests.conftest import ADMIN_TOKEN
from tests.fakes.gym_process import gym_process
from tests.fakes.live_gym import mini_benchmark


class RecordingProxy:
    """A proxy that forwards nothing: it writes down the first line of every request it gets
    (``GET http://host/…`` or ``CONNECT host:443``) and answers 502."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    first = conn.recv(65536).split(b"\r\n", 1)[0]
                    self.seen.append(first.decode("latin-1"))
                    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def proxy() -> Iterator[RecordingProxy]:
    p = RecordingProxy()
    yield p
    p.close()


def proxy_env(url: str) -> dict[str, str | None]:
    """Every spelling of every proxy variable naming ``url``, and no exclusions."""
    env: dict[str, str | None] = {}
    for name in PROXY_VARIABLES:
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = None
    return env


@pytest.fixture
def behind_proxy(proxy: RecordingProxy, monkeypatch: pytest.MonkeyPatch) -> RecordingProxy:
    """This process's environment names the recording proxy (restored after the test)."""
    for name, value in proxy_env(proxy.url).items():
        if value is None:
            monkeypatch.setenv(name, "")  # recorded, so whatever the code under test writes is undone
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    return proxy


def test_nothing_changes_when_no_proxy_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*PROXY_VARIABLES, *(n.lower() for n in PROXY_VARIABLES)):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "example.org")
    assert keep_off_proxies("http://gateway.internal:8700") == []
    assert os.environ["NO_PROXY"] == "example.org"


def test_loopback_and_the_gyms_hosts_join_what_the_operator_excluded(behind_proxy: RecordingProxy,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "corp.example, 10.0.0.0/8")
    monkeypatch.setenv("no_proxy", "intranet.example")
    kept = keep_off_proxies("http://gateway:8700", "http://[fd00::5]:8001/v1", None)
    assert kept == ["corp.example", "10.0.0.0/8", "intranet.example", "localhost", "127.0.0.1", "::1", "gateway",
                    "fd00::5"]
    assert os.environ["NO_PROXY"] == os.environ["no_proxy"] == ",".join(kept)
    assert keep_off_proxies("http://gateway:8700") == kept  # again: nothing doubled


def test_the_http_clients_the_gym_uses_honour_it(behind_proxy: RecordingProxy) -> None:
    """httpx (the gym's own clients) and reqwest (the e2b SDK's transport) read NO_PROXY when
    they are built: once it names loopback, a client built after reaches a loopback server
    directly, and a provider host still goes to the proxy."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")

    threading.Thread(target=answer, daemon=True).start()
    own = f"http://127.0.0.1:{port}/healthz"
    assert httpx.get(own).status_code == 502  # the premise: without the exclusion, the proxy gets it
    assert behind_proxy.seen == [f"GET {own} HTTP/1.1"]
    behind_proxy.seen.clear()

    keep_off_proxies()
    assert httpx.get(own).status_code == 200

    async def via_reqwest() -> int:
        async with httpx.AsyncClient(transport=AsyncPyqwestTransport(ReqwestTransport())) as client:
            return (await client.get(own)).status_code

    assert asyncio.run(via_reqwest()) == 200
    assert behind_proxy.seen == []
    assert httpx.get("http://provider.example/v1/models").status_code == 502  # egress still goes out the proxy
    assert behind_proxy.seen == ["GET http://provider.example/v1/models HTTP/1.1"]
    server.close()


def test_a_distributed_gateway_keeps_its_services_off_the_proxy(behind_proxy: RecordingProxy, tmp_path: Path) -> None:
    settings = GymSettings(data_dir=tmp_path, internal_secret="s" * 32, admin_token=ADMIN_TOKEN,
                           gateway_url="http://gateway.internal:8700")
    gym = build_gateway(settings, StoreSettings(), {"training": "http://training:8001", "sandbox": "http://10.1.2.3:8004"})
    try:
        excluded = os.environ["NO_PROXY"].split(",")
        assert {"127.0.0.1", "gateway.internal", "training", "10.1.2.3"} <= set(excluded)
        client = gym.gateway.links["training"].client
        assert client._transport_for_url(httpx.URL("http://training:8001/v1/jobs")) is client._transport  # noqa: SLF001
    finally:
        gym.gateway.store.dispose()


@pytest.mark.slow
def test_a_gym_behind_an_egress_proxy_validates_a_benchmark_and_the_proxy_sees_nothing(
        proxy: RecordingProxy, tmp_path: Path) -> None:
    """The whole path, in a gym process whose environment names the proxy for every scheme: a
    benchmark's validation runs Harbor trials, which call the gateway with the e2b SDK and
    httpx, carrying a sandbox key. Before the fix, every such call went to the proxy; the
    trials failed and the proxy saw the gateway's URLs."""
    with gym_process(tmp_path / "gym", "", env=proxy_env(proxy.url)) as gym:
        admin = httpx.Client(base_url=gym.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=120,
                             trust_env=False)
        r = admin.post("/admin/v1/benchmarks", json={"path": str(mini_benchmark(tmp_path / "bench", per_split=1))})
        assert r.status_code == 201, r.text
        deadline = time.monotonic() + 300
        while True:
            found = [b for b in admin.get("/admin/v1/benchmarks").json()["data"] if b["name"] == "mini"]
            if found and found[0]["status"] != "validating":
                break
            assert time.monotonic() < deadline, "validation did not end"
            time.sleep(0.5)
        assert found[0]["status"] == "ready", (found[0], (tmp_path / "gym" / "server.log").read_text()[-3000:])
    assert proxy.seen == []
