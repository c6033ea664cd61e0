"""Local inference under concurrency: throughput one request at a time vs N concurrent requests.

Runs the embedded gym on loopback with the tiny base model (local engine, continuous batching)
and sends the same list of greedy chat completions through the gateway twice: one at a time,
then from N concurrent clients. The clients run in a process of their own (as an agent's do), so
they do not take the gym's GIL. Greedy decoding makes both passes the same work (the same
completion tokens); prints completion tokens/s and requests/s of each, their ratio, and the
rows per forward pass the engine decoded in the concurrent pass.

Every answer is generated to ``--min-tokens`` (default: ``--max-tokens``; vLLM's ``min_tokens``
parameter, which the local engine honours): where the tiny model ends an answer depends on its
build (a locally trained model), so without it the same bench measured 3,882 completion tokens on
one machine's build and 120 on another's, the latter a test of per-request overhead, not batching.
``--min-tokens 0`` lets the model end its answers where it will.

    .venv/bin/python bench/inference_concurrency.py [--requests 48] [--concurrency 8] [--max-tokens 128] [--min-tokens N]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # torch's OpenMP threads busy-wait on a shared 2-core box

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from _common import ROOT, bench_dir, serve

from kit.settings import GymSettings, ProviderSecrets, default_models_dir
from ops.builder import build_embedded

QUESTIONS = [
    "Repeat: the quick brown fox jumps over the lazy dog",
    "Copy this JSON: {\"name\": \"blue whale\", \"size\": 30, \"colour\": \"grey\"}",
    "What is 57 + 38?",
    "Repeat: red lion, green frog, blue whale, white bear, brown owl, grey wolf",
    "Copy this JSON: {\"animal\": \"grey wolf\", \"legs\": 4, \"colour\": \"grey\"}",
    "Which is larger, 41 or 14?",
    "Repeat: one two three four five six seven eight nine ten eleven twelve",
    "Tell me a long story about numbers and words.",
]
"""Greedy answers of the tiny model: five of these prompts run on to ``max_tokens`` (a
generation-heavy workload, as rollouts are), three are answered in 2-3 tokens."""


def drive(url: str, key: str, workers: int, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """The client side: send ``bodies`` from ``workers`` threads; wall time and each completion."""
    local = threading.local()

    def call(body: dict[str, Any]) -> tuple[int, str]:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {key}"})
        r = local.client.post("/inference/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        data = r.json()
        return data["usage"]["completion_tokens"], data["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(call, [{**body, "max_tokens": 1, "min_tokens": 0} for body in bodies[:workers]]))  # connections open
        t0 = time.perf_counter()
        results = list(pool.map(call, bodies))
        return {"seconds": time.perf_counter() - t0, "results": results}


def run_clients(url: str, key: str, workers: int, bodies: list[dict[str, Any]]) -> tuple[float, list[Any]]:
    proc = subprocess.run([sys.executable, __file__, "--drive", url, "--key", key, "--concurrency", str(workers)],
                          input=json.dumps(bodies), capture_output=True, text=True, check=True, cwd=ROOT)
    out = json.loads(proc.stdout)
    return out["seconds"], out["results"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--min-tokens", type=int, default=None, help="default: --max-tokens")
    parser.add_argument("--models-dir", type=Path, default=default_models_dir())
    parser.add_argument("--drive", help=argparse.SUPPRESS)  # internal: the client process, bodies on stdin
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        print(json.dumps(drive(args.drive, args.key, args.concurrency, json.loads(sys.stdin.read()))))
        return
    import torch

    torch.set_num_threads(1)
    with bench_dir() as data:
        gym = build_embedded(GymSettings(data_dir=data, admin_token="bench-admin", models_dir=args.models_dir),
                             provider_secrets=ProviderSecrets({}), run_reaper=False)
        engine = gym.service_apps["inference"].state.inference.engine.engines["local"]
        bodies = [{"model": "tiny", "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                   "max_tokens": args.max_tokens, "temperature": 0,
                   "min_tokens": args.max_tokens if args.min_tokens is None else args.min_tokens}
                  for i in range(args.requests)]
        with serve(gym.app) as url:
            admin = {"Authorization": "Bearer bench-admin"}
            key = httpx.post(f"{url}/admin/v1/keys", json={"track": "joint", "budget_usd": 1000}, headers=admin,
                             timeout=60).json()["key"]
            run_clients(url, key, args.concurrency, bodies[: args.concurrency])  # warm: the model loaded
            engine.batch_sizes.clear()
            one_s, one = run_clients(url, key, 1, bodies)
            one_rows = list(engine.batch_sizes)
            engine.batch_sizes.clear()
            many_s, many = run_clients(url, key, args.concurrency, bodies)
            many_rows = list(engine.batch_sizes)
    assert one == many, "greedy completions differ between the two passes"
    tokens = sum(n for n, _ in one)
    print(f"local inference throughput, tiny base model, embedded gym through the gateway "
          f"({args.requests} greedy chat completions, max_tokens {args.max_tokens}, "
          f"min_tokens {bodies[0]['min_tokens']}, {tokens} completion tokens, "
          f"{os.cpu_count()} CPUs)")
    for label, seconds, rows in (("1 at a time", one_s, one_rows), (f"{args.concurrency} concurrent", many_s, many_rows)):
        print(f"  {label:<13}: {seconds:6.2f} s  {tokens / seconds:8.1f} completion tok/s  "
              f"{args.requests / seconds:6.2f} req/s  (mean {statistics.mean(rows):.2f} rows per forward pass, "
              f"max {max(rows)})")
    print(f"  ratio {args.concurrency} concurrent / 1 at a time: {one_s / many_s:.2f}x "
          f"(completion tok/s and req/s alike: the same work)")


if __name__ == "__main__":
    assert ROOT
    main()
