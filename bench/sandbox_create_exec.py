"""Sandbox create → first command's exit: what an agent waits for before its code runs.

Three ways, N sandboxes each, measured in the same run on loopback, the gym in a process of its
own (served as ``rsigym up`` serves it, with its defaults: bench/_common.py:gym_process), so the
SDK here does not share the gym's GIL, as no agent does:
  * the unmodified ``e2b`` SDK through the gateway (create, ``commands.run("echo ok")``, kill);
  * the same with plain httpx (control-plane POST + one Connect stream), to see what the SDK adds;
  * the local backend alone (bubblewrap + in-sandbox agent, no gateway, no ledger) — the baseline.
E2B's cloud reports create→exec p50 ≈ 0.44 s (DESIGN.md §6) for comparison.

    .venv/bin/python bench/sandbox_create_exec.py [--sandboxes 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time

import httpx
from _common import ROOT, gym_process, summary
from e2b import Sandbox

from kit.config import SandboxTemplate
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.local import LocalBackend


def via_sdk(url: str, key: str) -> float:
    t0 = time.perf_counter()
    sbx = Sandbox.create(template="base", timeout=60, api_key=key, api_url=f"{url}/sandbox",
                         sandbox_url=f"{url}/sandbox/envd")
    assert sbx.commands.run("echo ok").stdout.strip() == "ok"
    elapsed = time.perf_counter() - t0
    sbx.kill()
    return elapsed


def via_http(http: httpx.Client, key: str) -> float:
    t0 = time.perf_counter()
    created = http.post("/sandbox/v2/sandboxes", json={"templateID": "base", "timeout": 60},
                        headers={"X-API-Key": key}).json()
    body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", "echo ok"]}}).encode()
    headers = {"content-type": "application/connect+json", "connect-protocol-version": "1",
               "X-Access-Token": created["envdAccessToken"], "E2b-Sandbox-Id": created["sandboxID"]}
    raw = http.post("/sandbox/envd/process.Process/Start", content=struct.pack(">BI", 0, len(body)) + body,
                    headers=headers).content
    elapsed = time.perf_counter() - t0
    assert b"exitCode" not in raw or b'"exitCode":0' in raw
    http.delete(f"/sandbox/sandboxes/{created['sandboxID']}", headers={"X-API-Key": key})
    return elapsed


def via_backend(backend: LocalBackend, i: int) -> float:
    async def run() -> None:
        async for _ in backend.stream(f"sbx_bench{i}", {"op": "start", "cmd": "/bin/bash", "args": ["-c", "echo ok"]}):
            pass

    t0 = time.perf_counter()
    backend.create(SandboxSpec(f"sbx_bench{i}", SandboxTemplate(name="base")))
    asyncio.run(run())
    elapsed = time.perf_counter() - t0
    backend.kill(f"sbx_bench{i}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=50)
    args = parser.parse_args()
    backend = LocalBackend(None, 230_000)
    sdk, raw, base = [], [], []
    with gym_process("", key_request={"track": "joint", "budget_usd": 100}) as gym, \
            httpx.Client(base_url=gym.url, timeout=60) as http:
        url, key = gym.url, gym.key
        via_sdk(url, key), via_http(http, key), via_backend(backend, -1)  # warm up
        for i in range(args.sandboxes):  # interleaved, so load on the box hits all three alike
            sdk.append(via_sdk(url, key))
            raw.append(via_http(http, key))
            base.append(via_backend(backend, i))
    backend.close()
    print(f"sandbox create → first command exit, {args.sandboxes} sandboxes each (2 shared cores, loopback)")
    print(f"  e2b SDK via gateway : {summary(sdk)}")
    print(f"  httpx via gateway   : {summary(raw)}")
    print(f"  backend alone       : {summary(base)}")
    med = sorted(base)[len(base) // 2]
    print(f"  ratio p50 e2b-SDK/backend {sorted(sdk)[len(sdk) // 2] / med:.2f}x, "
          f"httpx/backend {sorted(raw)[len(raw) // 2] / med:.2f}x")


if __name__ == "__main__":
    assert ROOT
    main()
