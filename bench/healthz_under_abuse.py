"""/healthz latency while an attacker loops request bodies built to be expensive.

Starts an embedded gym in its own process (served as ``rsigym up`` serves it), probes
``GET /healthz`` for ``--seconds`` with no other traffic, then again while attacker processes
send, in a loop, to a JSON route (declared and chunked): 14 MiB bodies of five million ``{}``,
bodies just under the token limit, just under the element limit (invalid messages: the costly
kind to refuse) and deeply nested ones. Prints p50 / p99 of each phase, the ratio, and what the
attackers were answered. Nothing is asserted (see
tests/security/test_request_bounds.py for the bounds that must hold).

    .venv/bin/python bench/healthz_under_abuse.py [--seconds 15] [--attackers 2] [--shapes bomb|all]

``bomb`` (default): only the issue's 5M-``{}`` body; ``all``: every shape above.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _common import pct, summary

from kit.config import HttpConfig
from tests.fakes.gym_process import gym_process, push, repeat

CHAT = "/rollout/v1/chat/completions"


def bodies() -> list[tuple[str, bytes]]:
    http = HttpConfig()
    tokens = http.max_json_tokens // 2 - 100  # each "{}," is a brace and a comma
    values = http.max_json_elements - 100

    def messages(n: int) -> bytes:
        return b'{"model":"tiny","messages":[' + b",".join([b"{}"] * n) + b"]}"

    return [
        ("5M {} (14 MiB)", b"[" + b",".join([b"{}"] * 5_000_000) + b"]"),
        (f"{tokens} {{}} (just under the token limit)", messages(tokens)),
        (f"{values} {{}} (just under the element limit)", messages(values)),
        ("nested 100k deep", b'{"model":"tiny","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ]


def attack(port: int, key: str, stop: Any, answers: Any, shapes: str) -> None:
    """One attacker process: every body, declared and chunked, until ``stop`` is set."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    payloads = bodies() if shapes == "all" else bodies()[:1]
    while not stop.is_set():
        for name, body in payloads:
            declared = push(port, "POST", CHAT, {**headers, "Content-Length": str(len(body))}, iter([body]),
                            chunked=False)
            streamed = push(port, "POST", CHAT, headers, repeat(body, len(body)), chunked=True)
            answers.put([f"{name} declared: {declared.status}", f"{name} chunked: {streamed.status}"])


def probe(url: str, seconds: float) -> list[float]:
    samples: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            client.get("/healthz").raise_for_status()
            samples.append(time.perf_counter() - t0)
            time.sleep(0.02)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--shapes", choices=["bomb", "all"], default="bomb")
    args = parser.parse_args()

    ctx = multiprocessing.get_context("fork")
    answers: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp, gym_process(Path(tmp) / "data", "") as gym:
        key = gym.key()
        quiet = probe(gym.url, args.seconds)

        stop, queue = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=attack, args=(gym.port, key, stop, queue, args.shapes), daemon=True)
                 for _ in range(args.attackers)]
        for proc in procs:
            proc.start()
        time.sleep(2.0)
        abused = probe(gym.url, args.seconds)
        stop.set()
        for proc in procs:
            proc.join(timeout=120)
        while not queue.empty():
            answers.update(queue.get())

    print(f"/healthz, no other traffic     ({len(quiet):4d} probes): {summary(quiet)}")
    print(f"/healthz, {args.attackers} attackers ({args.shapes:4s}) ({len(abused):4d} probes): {summary(abused)}")
    print(f"p50 ratio {pct(abused, 50) / pct(quiet, 50):.2f}x   p99 ratio {pct(abused, 99) / pct(quiet, 99):.2f}x   "
          f"worst {max(abused) * 1000:.1f} ms")
    print("attacker answers:")
    for line, count in sorted(answers.items()):
        print(f"  {count:5d}  {line}")


if __name__ == "__main__":
    main()
