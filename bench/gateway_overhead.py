"""Gateway overhead: the latency the gateway adds to a rollout call.

Runs the stand-in provider in its own process and, in this one, the rollout service app on its own port
(called directly with a valid gateway signature) and the embedded gym on another port,
then alternates identical chat completions through both. Prints p50 / p99 of each, the
gateway's added latency (difference) and the ratio. Store: SQLite (default) or PostgreSQL
(``--store postgres``, needs 127.0.0.1:5432 db test).

    .venv/bin/python bench/gateway_overhead.py [--calls 300] [--store sqlite|postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import time

import httpx
from _common import PG_URL, embedded_gym, fresh_pg_schema, pct, serve, standin_process, summary

from kit.identity import Identity, sign
from kit.settings import StoreSettings
from storage.store import Store

BODY = {"model": "teacher", "messages": [{"role": "user", "content": "What is 12 + 30?"}], "max_tokens": 8}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()

    provider_key = "sk-bench-" + secrets.token_hex(8)
    with standin_process(provider_key) as provider, contextlib.ExitStack() as stack:
        store = None
        if args.store == "postgres":  # a schema of its own, dropped at the end (after the store is disposed)
            store = Store(PG_URL, StoreSettings(), schema=stack.enter_context(fresh_pg_schema()))
            stack.callback(store.dispose)
            store.migrate()
        with embedded_gym(provider, provider_key, store=store) as bench_gym, \
                serve(bench_gym.gym.service_apps["rollout"]) as service_url, httpx.Client(timeout=60) as client:
            gateway_url, key, settings = bench_gym.url, bench_gym.key, bench_gym.settings
            raw = json.dumps(BODY).encode()

            def direct() -> float:
                identity = Identity(request_id="req_bench", key_id="k", run_id="k", service="rollout",
                                    operation="chat.completions", policies=[{"models": "*"}], issued_at=time.time())
                headers = {"content-type": "application/json",
                           **sign(identity, settings.internal_secret or "", "POST", "/v1/chat/completions", raw)}
                t0 = time.perf_counter()
                r = client.post(f"{service_url}/v1/chat/completions", content=raw, headers=headers)
                elapsed = time.perf_counter() - t0
                assert r.status_code == 200, r.text
                return elapsed

            def through_gateway() -> float:
                t0 = time.perf_counter()
                r = client.post(f"{gateway_url}/rollout/v1/chat/completions", json=BODY,
                                headers={"Authorization": f"Bearer {key}"})
                elapsed = time.perf_counter() - t0
                assert r.status_code == 200, r.text
                return elapsed

            for _ in range(20):  # warm up imports, pools, tokenizers
                direct(), through_gateway()
            direct_times, gateway_times = [], []
            for _ in range(args.calls):
                direct_times.append(direct())
                gateway_times.append(through_gateway())
        if store is not None:
            store.dispose()

    added = [g - d for g, d in zip(gateway_times, direct_times, strict=True)]
    print(f"gateway overhead, {args.calls} sequential chat completions each, store={args.store}")
    print(f"  direct to service : {summary(direct_times)}")
    print(f"  through gateway   : {summary(gateway_times)}")
    print(f"  added (paired)    : p50 {pct(added, 50) * 1000:7.2f} ms  p99 {pct(added, 99) * 1000:7.2f} ms")
    print(f"  ratio gateway/direct: p50 {pct(gateway_times, 50) / pct(direct_times, 50):.2f}x  "
          f"p99 {pct(gateway_times, 99) / pct(direct_times, 99):.2f}x")


if __name__ == "__main__":
    main()
