"""Streams through the gateway are bounded: a client that opens a stream and reads nothing holds
its producer back instead of growing the gym. The gym is served in its own OS process
(``rsigym up``) so its resident memory is measured alone, from /proc, while an attacker:

* starts ``yes`` in a sandbox over a raw Connect call (what the E2B SDK sends) and never reads;
* opens a streamed chat completion and never reads, while another call of the same run goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.conftest import ADMIN_TOKEN, MODELS_DIR, admin_headers
from tests.fakes.servers import free_port

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

STALL_S = 6.0
"""How long the attacker reads nothing."""
GROWTH_BOUND = 48 * 1024 * 1024
"""The most the gym's RSS may grow meanwhile. Unbounded relays grew it by ~130 MB/s."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("streams")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN, "RSIGYM_MODELS_DIR": str(MODELS_DIR)}
    env.pop("RSIGYM_CONFIG", None)
    log = (tmp / "gym.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "ops.cli.main", "up", "--data-dir", str(tmp / "data"),
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the gym exited with {proc.returncode}: {(tmp / 'gym.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the gym did not become healthy"
            time.sleep(0.3)
        r = httpx.post(f"{url}/admin/v1/keys", json={"track": "joint", "budget_usd": 5.0}, headers=admin_headers())
        assert r.status_code == 201, r.text
        yield {"url": url, "pid": proc.pid, "key": r.json()["key"]}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            # A stream an attacker stalled and then dropped must not keep the gym from stopping
            # (it once did: the relay waited forever on the sandbox service's last message).
            pytest.fail("the gym did not stop within 30 s of SIGTERM after the stalled streams")
        log.close()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def peak_growth(pid: int, seconds: float) -> tuple[int, int]:
    """(baseline RSS, the largest growth over it) sampled for ``seconds``."""
    base = rss(pid)
    peak = base
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.25)
        peak = max(peak, rss(pid))
    return base, peak - base


def envelope(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(data)) + data


def test_a_sandbox_command_nobody_reads_does_not_grow_the_gym(served: dict[str, Any]) -> None:
    url, key = served["url"], served["key"]
    sbx = Sandbox.create(template="base", timeout=120, api_key=key, api_url=f"{url}/sandbox",
                         sandbox_url=f"{url}/sandbox/envd")
    try:
        headers = {"X-API-Key": key, "E2b-Sandbox-Id": sbx.sandbox_id, "Content-Type": "application/connect+json",
                   "Connect-Protocol-Version": "1"}
        body = envelope({"process": {"cmd": "/usr/bin/yes", "args": ["rsigym-stream-bound"]}})
        with httpx.Client(timeout=60) as client, client.stream(
                "POST", f"{url}/sandbox/envd/process.Process/Start", content=body, headers=headers) as r:
            assert r.status_code == 200
            chunks = r.iter_raw(65536)
            first = next(chunks)
            assert first  # the command started and streams: from now on the attacker reads nothing
            time.sleep(1.0)
            base, growth = peak_growth(served["pid"], STALL_S)
            print(f"gym RSS {base / 2**20:.0f} MiB, grew {growth / 2**20:.1f} MiB in {STALL_S} s of a stalled `yes`")
            assert growth < GROWTH_BOUND, f"gym RSS grew {growth / 2**20:.0f} MiB (from {base / 2**20:.0f} MiB)"
            # the stream is alive and still serves what was held back, in order
            more = b"".join(next(chunks) for _ in range(8))
            assert b"\"stdout\"" in more and len(more) > 65536
        # the gym still answers this run and others
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    finally:
        sbx.kill()


def test_a_chat_stream_nobody_reads_holds_nothing_back(served: dict[str, Any]) -> None:
    url, key = served["url"], served["key"]
    auth = {"Authorization": f"Bearer {key}"}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "count: 1 2 3"}], "max_tokens": 200,
            "temperature": 1.0, "seed": 7}
    with httpx.Client(base_url=url, timeout=120, headers=auth) as client:
        with client.stream("POST", "/inference/v1/chat/completions", json={**chat, "stream": True}) as stalled:
            assert stalled.status_code == 200
            base, growth = peak_growth(served["pid"], 2.0)
            # the model is not held by the reader that does not read: the same run's next call is served
            other = client.post("/inference/v1/chat/completions", json={**chat, "max_tokens": 4})
            assert other.status_code == 200, other.text
            assert other.json()["choices"][0]["message"]["role"] == "assistant"
            print(f"gym RSS {base / 2**20:.0f} MiB, grew {growth / 2**20:.1f} MiB during a stalled chat stream")
            assert growth < GROWTH_BOUND
        balance = client.get("/v1/balance").json()
        deadline = time.monotonic() + 30
        while balance["reserved_usd"] != 0 and time.monotonic() < deadline:  # the relay's close settles
            time.sleep(0.2)
            balance = client.get("/v1/balance").json()
        assert balance["reserved_usd"] == 0, balance
