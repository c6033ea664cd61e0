"""Gateway vs LiteLLM proxy: what each adds to a direct call to the same upstream, in one run.

Starts the stand-in provider in its own process, the LiteLLM proxy in its own process (from the
bench's own environment, ``--litellm-python``; no database, one model ``teacher`` routed to the
stand-in as an OpenAI-compatible upstream, a master key so it checks auth) and the gym in its own
process (served as ``rsigym up`` serves it, with the same ``teacher``: auth, policy, reserve/settle
on SQLite, the OpenAI pass-through; bench/_common.py:gym_process), so no target shares the client's
GIL. A fourth target is the floor under any gateway on the gym's stack: a pass-through that only
puts the provider's key on each call and relays it, served as the gym serves (uvicorn, the gym's
HTTP protocol) on the gym's provider client (services/rollout/backends/http1.py) — no auth, no policy, no ledger
(bench/_passthrough.py). Then interleaves identical chat completions direct / LiteLLM / gym /
floor (the order rotates each round) with one sequential keep-alive httpx client per target,
first plain, then ``"stream": true``. Prints p50 / p99 of each target, what LiteLLM, the gym and the
floor add over direct (paired per round), the ratio gym-added / LiteLLM-added, and what the gym
adds over the floor (paired: its own work); for streams the same for time to first body byte
(TTFB) and to the end of the stream (TTLB).

    python3.12 -m venv .bench-venv && .bench-venv/bin/pip install 'litellm[proxy]'   # once
    .venv/bin/python bench/gateway_vs_litellm.py [--calls 300] [--stream-tokens 32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _common import (
    ROOT,
    TEACHER_KEY_ENV,
    free_port,
    gym_process,
    pct,
    server_process,
    standin_process,
    summary,
    teacher_config,
)

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "teacher", "messages": [{"role": "user", "content": "What is 12 + 30?"}],
                        "max_tokens": 8}
PROXY_CONFIG = """\
model_list:
  - model_name: teacher
    litellm_params:
      model: openai/teacher
      api_base: {api_base}
      api_key: os.environ/{key_env}
general_settings:
  master_key: {master_key}
"""
TARGETS = ("direct", "litellm", "gym", "floor")


@dataclass
class Proxy:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def wait_ready(self, timeout_s: float = 180) -> None:
        """Until the proxy's readiness route answers 200; raises with its log's tail if it never does."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(self.url + "/health/readiness", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"LiteLLM proxy did not become ready (exit {self.proc.poll()}); log tail:\n{tail}")
            time.sleep(0.25)


@contextlib.contextmanager
def litellm_proxy(python: Path, provider_url: str, provider_key: str, master_key: str) -> Iterator[Proxy]:
    """Start the LiteLLM proxy (no database) in its own process, ``teacher`` routed to the stand-in;
    stopped by its PID when the block ends. Call ``wait_ready()`` before using it."""
    with tempfile.TemporaryDirectory(prefix="bench-litellm-") as tmp:
        work = Path(tmp)
        config = work / "config.yaml"
        config.write_text(PROXY_CONFIG.format(api_base=provider_url + "/v1", key_env=TEACHER_KEY_ENV,
                                              master_key=master_key))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "REDIS_HOST")}
        env.update({TEACHER_KEY_ENV: provider_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"})
        log = work / "proxy.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(python), "-m", "litellm.proxy.proxy_cli", "--config", str(config), "--host", "127.0.0.1",
                 "--port", str(port), "--num_workers", "1"],
                cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        try:
            yield Proxy(f"http://127.0.0.1:{port}", proc, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextlib.contextmanager
def passthrough_process(provider_url: str, provider_key: str) -> Iterator[str]:
    """bench/_passthrough.py in its own process, relaying to the stand-in; stopped by its PID."""
    with server_process(lambda port: [sys.executable, str(ROOT / "bench" / "_passthrough.py"), str(port), provider_url,
                                      TEACHER_KEY_ENV],
                        {TEACHER_KEY_ENV: provider_key}, "/", "the pass-through") as url:
        yield url


def timed_call(client: httpx.Client, url: str, key: str, raw: bytes) -> float:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    t0 = time.perf_counter()
    r = client.post(url, content=raw, headers=headers)
    elapsed = time.perf_counter() - t0
    if r.status_code != 200 or r.json()["choices"][0]["message"]["content"] != "42":
        raise RuntimeError(f"{url}: {r.status_code} {r.text[:300]}")
    return elapsed


def timed_stream(client: httpx.Client, url: str, key: str, raw: bytes) -> tuple[float, float]:
    """(time to the first body byte, time to the end of the stream), after a complete stream."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = bytearray()
    t0 = time.perf_counter()
    first = 0.0
    with client.stream("POST", url, content=raw, headers=headers) as r:
        for piece in r.iter_raw():
            if piece and not body:
                first = time.perf_counter() - t0
            body += piece
    last = time.perf_counter() - t0
    if r.status_code != 200 or b"data: [DONE]" not in body or body.count(b'"content"') < 2:
        raise RuntimeError(f"{url}: {r.status_code} {bytes(body[:300])!r}")
    return first, last


def wrong_key_status(client: httpx.Client, url: str, raw: bytes) -> int:
    """The status a call with a wrong key gets (LiteLLM without a database answers 400 "No connected db.")."""
    r = client.post(url, content=raw, headers={"Authorization": "Bearer sk-wrong", "Content-Type": "application/json"})
    if r.status_code < 400:
        raise RuntimeError(f"{url} accepted a wrong key: {r.status_code}")
    return r.status_code


def rounds(calls: int, probes: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    """``calls`` rounds, each calling every target once; the order rotates so none always goes first."""
    results: dict[str, list[Any]] = {name: [] for name in probes}
    names = list(probes)
    for i in range(calls):
        for name in names[i % len(names):] + names[:i % len(names)]:
            results[name].append(probes[name]())
    return results


def report(title: str, times: dict[str, list[float]]) -> None:
    direct = times["direct"]
    added = {name: [t - d for t, d in zip(times[name], direct, strict=True)] for name in ("litellm", "gym", "floor")}
    over_floor = [g - f for g, f in zip(times["gym"], times["floor"], strict=True)]
    print(f"  {title}")
    for name, label in (("direct", "direct to stand-in"), ("litellm", "via LiteLLM proxy"), ("gym", "via gym gateway"),
                        ("floor", "via pass-through")):
        print(f"    {label:<19}: {summary(times[name])}")
    for name, label in (("litellm", "LiteLLM added"), ("gym", "gym added"), ("floor", "floor added")):
        print(f"    {label:<19}: p50 {pct(added[name], 50) * 1000:7.2f} ms  p99 {pct(added[name], 99) * 1000:7.2f} ms"
              "  (paired per round)")
    print(f"    {'gym over the floor':<19}: p50 {pct(over_floor, 50) * 1000:7.2f} ms  p99 {pct(over_floor, 99) * 1000:7.2f} ms"
          "  (paired per round: the gym's own work)")
    ratio = {q: pct(added["gym"], q) / pct(added["litellm"], q) if pct(added["litellm"], q) > 0 else float("nan")
             for q in (50, 99)}
    print(f"    ratio gym-added / LiteLLM-added: p50 {ratio[50]:.2f}  p99 {ratio[99]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="rounds per mode (each round calls every target once)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--stream-tokens", type=int, default=32, help="max_tokens of the streamed completion")
    parser.add_argument("--litellm-python", type=Path, default=ROOT / ".bench-venv" / "bin" / "python",
                        help="python of the environment with litellm[proxy] installed")
    args = parser.parse_args()

    python: Path = args.litellm_python
    if not python.exists():
        venv = python.parent.parent
        base = Path(sys.base_prefix) / "bin" / "python3"
        print(f"no LiteLLM proxy environment at {python}; create it with:\n"
              f"  {base} -m venv {venv} && {venv}/bin/pip install 'litellm[proxy]'", file=sys.stderr)
        sys.exit(2)

    stream_body = {"model": "teacher", "messages": [{"role": "user", "content": "Tell me about research."}],
                   "max_tokens": args.stream_tokens, "stream": True, "stream_options": {"include_usage": True}}
    raw, raw_stream = json.dumps(BODY).encode(), json.dumps(stream_body).encode()
    load_before = os.getloadavg()[0]
    t_start = time.monotonic()
    provider_key = "sk-bench-" + secrets.token_hex(8)
    master_key = "sk-master-" + secrets.token_hex(8)
    with standin_process(provider_key) as provider, \
            litellm_proxy(python, provider, provider_key, master_key) as proxy, \
            gym_process(teacher_config(provider), {TEACHER_KEY_ENV: provider_key}) as gym, \
            passthrough_process(provider, provider_key) as floor, \
            httpx.Client(timeout=60) as c_direct, httpx.Client(timeout=60) as c_proxy, \
            httpx.Client(timeout=60) as c_gym, httpx.Client(timeout=60) as c_floor:
        proxy.wait_ready()  # it started while the gym was built
        targets = {
            "direct": (c_direct, provider + CHAT, provider_key),
            "litellm": (c_proxy, proxy.url + CHAT, master_key),
            "gym": (c_gym, gym.url + "/rollout" + CHAT, gym.key),
            "floor": (c_floor, floor + CHAT, "unused"),  # it checks no key: the floor of what checks them
        }
        refused = {name: wrong_key_status(client, url, raw) for name, (client, url, _) in targets.items()
                   if name != "floor"}

        def plain(name: str) -> Callable[[], float]:
            client, url, key = targets[name]
            return lambda: timed_call(client, url, key, raw)

        def streamed(name: str) -> Callable[[], tuple[float, float]]:
            client, url, key = targets[name]
            return lambda: timed_stream(client, url, key, raw_stream)

        plain_probes = {name: plain(name) for name in TARGETS}
        stream_probes = {name: streamed(name) for name in TARGETS}
        rounds(args.warmup, plain_probes)
        rounds(args.warmup, stream_probes)
        started = time.monotonic()
        startup = started - t_start
        plain_times = rounds(args.calls, plain_probes)
        stream_times = rounds(args.calls, stream_probes)
        measured = time.monotonic() - started
        balance = c_gym.get(gym.url + "/v1/balance", headers={"Authorization": f"Bearer {gym.key}"}).json()

    print(f"gateway vs LiteLLM proxy: {args.calls} rounds per mode (direct / LiteLLM / gym / floor interleaved, "
          f"sequential keep-alive clients), {measured:.1f} s measured after {startup:.1f} s of start-up and warm-up")
    print(f"  machine: {os.cpu_count()} CPUs, 1-min load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print(f"  a wrong key was refused by each: {refused}; the gym metered every call: "
          f"spent ${balance['spent_usd']:.6f}, reserved ${balance['reserved_usd']:.6f}")
    report("chat completion (plain, max_tokens 8)", plain_times)
    report(f"streamed, time to first byte (max_tokens {args.stream_tokens})",
           {name: [first for first, _ in v] for name, v in stream_times.items()})
    report(f"streamed, time to last byte (max_tokens {args.stream_tokens})",
           {name: [last for _, last in v] for name, v in stream_times.items()})


if __name__ == "__main__":
    main()
