"""Gateway A/B: two versions of the gym's code, each in a gym process of its own, on one stand-in
provider, called in the same rounds.

On a shared 2-core box the time of a direct call moves by 2× from one minute to the next, so two
runs of ``gateway_vs_litellm.py`` one after the other cannot tell a 1 ms change from the box. Here
each round calls the stand-in direct, then gym A and gym B (the order alternates), and what each
gym adds over that round's direct call is paired: the difference B − A is measured under the same
load. Each gym is ``rsigym up``'s server (tests/fakes/gym_process.py) started from its own code tree
(a ``git worktree`` of the revision to compare) with this project's interpreter; both route
``teacher`` to the same stand-in and meter every call on their own SQLite store.

The rounds run in ``--legs`` legs (default 2), each with both gyms' processes started afresh, the
one started first alternating from leg to leg. On one machine (a 2-vCPU VM) the process started
first ran slower for its whole life: an A/A run (one tree against itself, one leg) gave B − A of
about −0.5 ms p50, and +0.4 ms with the start order reversed, the slower process using ~25 % more
CPU time for the same calls (same RSS, no page faults, pinning both to one CPU changed nothing). Each leg's own B − A is printed, so such a bias shows, and the pooled figure cancels it.

With ``--stream`` each call is a streamed completion (``--stream-tokens`` tokens), and what each
gym adds is paired for the time to the first body byte and to the end of the stream.

    git worktree add /tmp/before <rev>
    .venv/bin/python bench/gateway_ab.py /tmp/before . [--calls 500] [--stream [--stream-tokens 32]]
    git worktree remove /tmp/before
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import tempfile
import time
from pathlib import Path

import httpx
from _common import TEACHER_KEY_ENV, pct, standin_process, teacher_config
from gateway_vs_litellm import timed_stream

BODY = {"model": "teacher", "messages": [{"role": "user", "content": "What is 12 + 30?"}], "max_tokens": 8}
WARM_UP = 100


def run_leg(client: httpx.Client, provider: str, provider_key: str, gyms: list[tuple[str, str, str]],
            args: argparse.Namespace, stream_body: bytes, directs: list[tuple[float, ...]],
            added: list[list[tuple[float, ...]]]) -> float:
    """One leg: warm-up, then ``args.calls / args.legs`` rounds of direct, then A and B (in an
    order that alternates each round), each gym's added time appended to ``added``. Returns the
    seconds measured."""

    def timed(url: str, headers: dict[str, str]) -> tuple[float, ...]:
        if args.stream:  # (first byte, end of stream)
            return timed_stream(client, url, headers["Authorization"].removeprefix("Bearer "), stream_body)
        t0 = time.perf_counter()
        r = client.post(url, json=BODY, headers=headers)
        elapsed = time.perf_counter() - t0
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "42", r.text
        return (elapsed,)

    def direct() -> tuple[float, ...]:
        return timed(f"{provider}/v1/chat/completions", {"Authorization": f"Bearer {provider_key}"})

    def via(gym: tuple[str, str, str]) -> tuple[float, ...]:
        return timed(f"{gym[1]}/rollout/v1/chat/completions", {"Authorization": f"Bearer {gym[2]}"})

    for _ in range(WARM_UP):
        direct(), via(gyms[0]), via(gyms[1])
    t0 = time.perf_counter()
    for i in range(args.calls // args.legs):
        d = direct()
        directs.append(d)
        for j in ((0, 1) if i % 2 == 0 else (1, 0)):
            added[j].append(tuple(t - dt for t, dt in zip(via(gyms[j]), d, strict=True)))
            if args.pause_ms:
                time.sleep(args.pause_ms / 1e3)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="code tree of gym A (the baseline)")
    parser.add_argument("b", type=Path, help="code tree of gym B")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--stream", action="store_true", help="streamed completions: first byte and end of stream")
    parser.add_argument("--stream-tokens", type=int, default=32, help="max_tokens of a streamed completion")
    parser.add_argument("--pause-ms", type=float, default=0.0,
                        help="sleep this long after each call, so each gym sits idle between its calls as it does "
                             "in gateway_vs_litellm.py while LiteLLM answers (~10 ms there): caches go cold")
    parser.add_argument("--legs", type=int, default=2,
                        help="the rounds are split into this many legs, each with both gyms started afresh, which "
                             "one first alternating: the gym started first can run slower for the whole leg")
    args = parser.parse_args()
    stream_body = json.dumps({**BODY, "messages": [{"role": "user", "content": "Tell me about research."}],
                              "max_tokens": args.stream_tokens, "stream": True,
                              "stream_options": {"include_usage": True}}).encode()
    import tests.fakes.gym_process as started

    provider_key = "sk-bench-" + secrets.token_hex(8)
    os.environ[TEACHER_KEY_ENV] = provider_key  # each gym's process inherits it
    directs: list[tuple[float, ...]] = []
    added: list[list[tuple[float, ...]]] = [[], []]
    legs: list[tuple[str, float]] = []  # (which gym started first, B - A p50 of the leg's first figure)
    spent: list[dict[str, float]] = [{"spent_usd": 0.0, "reserved_usd": 0.0}, {"spent_usd": 0.0, "reserved_usd": 0.0}]
    measured = 0.0
    with standin_process(provider_key) as provider, httpx.Client(timeout=60) as client:
        for leg in range(args.legs):
            first = leg % 2  # 0: A's process starts first, 1: B's
            with contextlib.ExitStack() as stack:
                gyms: list[tuple[str, str, str]] = [("", "", ""), ("", "", "")]
                for j in (first, 1 - first):
                    tree = (args.a, args.b)[j]
                    started.ROOT = tree.resolve()  # the gym's process runs from this tree's code
                    data = stack.enter_context(tempfile.TemporaryDirectory(prefix="rsigym-ab-", ignore_cleanup_errors=True))
                    gym = stack.enter_context(started.gym_process(Path(data), teacher_config(provider)))
                    r = client.post(f"{gym.url}/admin/v1/keys",
                                    json={"policy": {"services": {"rollout": {}}}, "budget_usd": 1000},
                                    headers={"Authorization": f"Bearer {started.ADMIN_TOKEN}"})
                    r.raise_for_status()
                    gyms[j] = (str(tree), gym.url, r.json()["key"])
                leg_added: list[list[tuple[float, ...]]] = [[], []]
                measured += run_leg(client, provider, provider_key, gyms, args, stream_body, directs, leg_added)
                for j in (0, 1):
                    added[j] += leg_added[j]
                    balance = client.get(f"{gyms[j][1]}/v1/balance", headers={"Authorization": f"Bearer {gyms[j][2]}"}).json()
                    spent[j] = {k: spent[j][k] + balance[k] for k in ("spent_usd", "reserved_usd")}
                legs.append(("AB"[first], pct([b[0] - a[0] for a, b in zip(*leg_added, strict=True)], 50)))

    print(f"gateway A/B: {args.calls} rounds (direct, then A and B in alternating order"
          f"{f', {args.pause_ms:g} ms pause after each gym call' if args.pause_ms else ''}) in {args.legs} legs, "
          f"{measured:.1f} s measured; machine: {os.cpu_count()} CPUs, 1-min load {os.getloadavg()[0]:.2f} after")
    print("  legs (which gym's process started first: B − A p50 of the leg): "
          + ", ".join(f"{first} first {diff * 1e3:+.2f} ms" for first, diff in legs))
    figures = (("time to first byte", "to the end of the stream") if args.stream else ("",))
    for k, figure in enumerate(figures):
        if figure:
            print(f" streamed ({args.stream_tokens} tokens), {figure}")
        a_added, b_added = ([values[k] for values in added[j]] for j in (0, 1))
        diff = [b - a for a, b in zip(a_added, b_added, strict=True)]
        ds = [d[k] for d in directs]
        print(f"  direct to stand-in : p50 {pct(ds, 50) * 1e3:7.2f} ms  p99 {pct(ds, 99) * 1e3:7.2f} ms")
        for name, values, balance in zip(("A", "B"), (a_added, b_added), spent, strict=True):
            print(f"  gym {name} added        : p50 {pct(values, 50) * 1e3:7.2f} ms  p99 {pct(values, 99) * 1e3:7.2f} ms"
                  f"  (metered: spent ${balance['spent_usd']:.6f}, reserved ${balance['reserved_usd']:.6f})  "
                  f"{(args.a, args.b)[ord(name) - ord('A')]}")
        print(f"  B − A, paired per round: p50 {pct(diff, 50) * 1e3:+.2f} ms  p99 {pct(diff, 99) * 1e3:+.2f} ms")
        print(f"  ratio B-added / A-added: p50 {pct(b_added, 50) / pct(a_added, 50):.2f}  "
              f"p99 {pct(b_added, 99) / pct(a_added, 99):.2f}")


if __name__ == "__main__":
    main()
