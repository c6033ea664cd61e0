"""The rollout service's provider client against the alternatives, on one stand-in provider.

Sequential keep-alive chat completions (the gateway's own call pattern for one agent) from this
process, on uvloop as the gym serves, to the stand-in provider in a process of its own: the
gym's http1 client (services/rollout/backends/http1.py), aiohttp (what the gym used before, and
still uses for a provider behind a proxy) and httpx. Each client runs in blocks, the order of the
clients turning every block; each figure is the median of a client's blocks: wall time and this
process's CPU time per call. The ratio is http1 / aiohttp (below 1: http1 costs less).

    .venv/bin/python bench/provider_client.py [--calls 1000] [--blocks 6]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import uvloop
from _common import standin_process

from services.rollout.backends.http1 import Http1Pool

BODY = json.dumps({"model": "teacher", "messages": [{"role": "user", "content": "What is 12 + 30?"}],
                   "max_tokens": 8}).encode()


def cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


async def measure(url: str, key: str, calls: int, blocks: int) -> dict[str, list[tuple[float, float]]]:
    target = url + "/v1/chat/completions"
    headers = {"content-type": "application/json", "accept": "application/json", "authorization": f"Bearer {key}"}
    pool = Http1Pool(connect_s=10, read_s=60)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256), trust_env=False,
                                    timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=60))
    client = httpx.AsyncClient(trust_env=False, timeout=60)

    async def http1() -> bytes:
        answer = await pool.post(target, BODY, headers)
        try:
            return await answer.read()
        finally:
            answer.release()

    async def via_aiohttp() -> bytes:
        response = await session.post(target, data=BODY, headers=headers, allow_redirects=False)
        try:
            return await response.read()
        finally:
            response.release()

    async def via_httpx() -> bytes:
        return (await client.post(target, content=BODY, headers=headers)).content

    clients: list[tuple[str, Callable[[], Awaitable[bytes]]]] = [
        ("http1", http1), ("aiohttp", via_aiohttp), ("httpx", via_httpx)]
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in clients}
    try:
        for name, call in clients:  # warm each, and check it gets the answer
            for _ in range(100):
                assert b'"42"' in await call(), name
        for block in range(blocks):
            turn = block % len(clients)
            for name, call in clients[turn:] + clients[:turn]:
                cpu0, wall0 = cpu_s(), time.perf_counter()
                for _ in range(calls):
                    await call()
                figures[name].append(((time.perf_counter() - wall0) / calls, (cpu_s() - cpu0) / calls))
    finally:
        await pool.close()
        await session.close()
        await client.aclose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per block")
    parser.add_argument("--blocks", type=int, default=6, help="blocks per client")
    args = parser.parse_args()
    key = secrets.token_hex(8)
    with standin_process(key) as url:
        figures = uvloop.run(measure(url, key, args.calls, args.blocks))
    median = {name: (statistics.median(w for w, _ in v) * 1e6, statistics.median(c for _, c in v) * 1e6)
              for name, v in figures.items()}
    print(f"provider client: {args.blocks} blocks of {args.calls} sequential keep-alive calls per client to the "
          f"stand-in provider, order turning each block; {os.cpu_count()} CPUs, 1-min load {os.getloadavg()[0]:.2f}")
    for name, (wall, cpu) in median.items():
        print(f"  {name:8s}: wall {wall:7.0f} µs a call   this process's CPU {cpu:6.0f} µs a call")
    (w1, c1), (wa, ca) = median["http1"], median["aiohttp"]
    print(f"  http1 - aiohttp: wall {w1 - wa:+.0f} µs, CPU {c1 - ca:+.0f} µs; "
          f"ratio http1 / aiohttp: wall {w1 / wa:.2f}, CPU {c1 / ca:.2f}")


if __name__ == "__main__":
    main()
