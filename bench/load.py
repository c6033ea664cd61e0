"""Load: mixed traffic from many run keys, abusive clients among them, then an exact ledger check.

Starts the stand-in provider and an embedded gym in their own processes (the gym served as
``rsigym up`` serves it, SQLite store), registers a two-task benchmark and creates ``--keys`` run
keys. Probes ``GET /healthz`` alone for a baseline, then for ``--seconds`` runs, from this
process, one client per key:

* most keys: chat completions (rollout, the stand-in teacher), streamed chat, balance and record
  reads; now and then a sandbox (create, one command over the E2B daemon protocol, kill) when
  bubblewrap is present; a few small training jobs and evaluations in all (heavy: kept rare);
* abusive keys: slow stream readers (read one chunk, then stall), big bodies (64 MiB declared and
  sent on a JSON route), deeply nested JSON.

Prints throughput, p50 / p99 per route, errors by type, /healthz p99 idle and under the mix (the
ratio), then waits for jobs and sandboxes to end and reconciles the ledger exactly, per key:
budget - spent - reserved == remaining (as /v1/balance answers), spent == the sum of the closed
ledger rows of its subtree, reserved == the sum of its open ones, no reservation left held, no
negative balance. Prints RECONCILED or each discrepancy. Loopback only; nothing is asserted.

    .venv/bin/python bench/load.py [--seconds 60] [--keys 50]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import secrets
import shutil
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _common import pct, standin_process, summary

from tests.fakes.gym_process import ADMIN_TOKEN, GymProcess, gym_process, push, repeat
from tests.fakes.live_gym import mini_benchmark

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = "/rollout/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is 12 + 30?"}]
ROWS = [{"messages": [{"role": "user", "content": f"Repeat: red lion {i}"},
                      {"role": "assistant", "content": f"red lion {i}"}]} for i in range(8)]
DATASET = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
TINY_JOB = {"base_model": "tiny", "steps": 2, "batch_size": 4, "max_length": 64}
MiB = 1024 * 1024
FINAL = ("succeeded", "failed", "cancelled")


@dataclass
class Tally:
    """Every call of the mix: (route, seconds, outcome), outcome a status or an error type."""

    calls: list[tuple[str, float, str]] = field(default_factory=list)
    jobs: list[tuple[str, str, str]] = field(default_factory=list)
    """(training|evaluation, job id, the owner's key) started during the mix."""

    def add(self, route: str, seconds: float, outcome: str) -> None:
        self.calls.append((route, seconds, outcome))


def outcome_of(response: httpx.Response) -> str:
    if response.status_code < 400:
        return str(response.status_code)
    try:
        kind = response.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        kind = "non-standard"
    return f"{response.status_code} {kind}"


class Client:
    """One key's traffic."""

    def __init__(self, http: httpx.AsyncClient, key: str, tally: Tally, heavy: asyncio.Semaphore, budget: dict[str, int]):
        self.http, self.key, self.tally, self.heavy, self.budget = http, key, tally, heavy, budget
        self.headers = {"Authorization": f"Bearer {key}"}

    async def timed(self, route: str, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        t0 = time.perf_counter()
        try:
            response = await self.http.request(method, path, headers={**self.headers, **kwargs.pop("headers", {})},
                                               **kwargs)
        except httpx.HTTPError as err:
            self.tally.add(route, time.perf_counter() - t0, type(err).__name__)
            return None
        self.tally.add(route, time.perf_counter() - t0, outcome_of(response))
        return response

    async def chat(self) -> None:
        await self.timed("chat", "POST", CHAT, json={"model": "teacher", "messages": MESSAGES, "max_tokens": 16})

    async def stream(self, stall_s: float = 0.0) -> None:
        route = "abuse.slow_reader" if stall_s else "chat.stream"
        t0 = time.perf_counter()
        body = {"model": "teacher", "messages": MESSAGES, "max_tokens": 64, "stream": True}
        try:
            async with self.http.stream("POST", CHAT, json=body, headers=self.headers) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self.tally.add(route, time.perf_counter() - t0, outcome_of(response))
                    return
                chunks = response.aiter_raw()
                async for _ in chunks:
                    if stall_s:  # a reader that stops reading after its first chunk
                        await asyncio.sleep(stall_s)
                        stall_s = 0.0
            self.tally.add(route, time.perf_counter() - t0, str(response.status_code))
        except httpx.HTTPError as err:
            self.tally.add(route, time.perf_counter() - t0, type(err).__name__)

    async def balance(self) -> None:
        await self.timed("balance", "GET", "/v1/balance")

    async def records(self) -> None:
        await self.timed("records.events", "GET", "/records/v1/events")

    async def sandbox(self) -> None:
        async with self.heavy:
            t0 = time.perf_counter()
            made = await self.timed("sandbox.create", "POST", "/sandbox/v2/sandboxes",
                                    json={"templateID": "base", "timeout": 60})
            if made is None or made.status_code != 201:
                return
            created = made.json()
            body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", "echo ok"]}}).encode()
            headers = {"content-type": "application/connect+json", "connect-protocol-version": "1",
                       "X-Access-Token": created["envdAccessToken"], "E2b-Sandbox-Id": created["sandboxID"]}
            await self.timed("sandbox.exec", "POST", "/sandbox/envd/process.Process/Start",
                             content=struct.pack(">BI", 0, len(body)) + body, headers=headers)
            await self.timed("sandbox.kill", "DELETE", f"/sandbox/sandboxes/{created['sandboxID']}")
            self.tally.add("sandbox (create→kill)", time.perf_counter() - t0, "done")

    async def train(self) -> None:
        uploaded = await self.timed("training.dataset", "POST", "/training/v1/datasets", content=DATASET)
        if uploaded is None or uploaded.status_code != 201:
            return
        job = await self.timed("training.job", "POST", "/training/v1/jobs",
                               json={"datasets": [uploaded.json()["id"]], **TINY_JOB})
        if job is not None and job.status_code == 201:
            self.tally.jobs.append(("training", job.json()["id"], self.key))

    async def evaluate(self) -> None:
        job = await self.timed("evaluation.job", "POST", "/evaluation/v1/jobs",
                               json={"benchmark": "loadmini", "split": "dev", "model": "tiny", "limit": 1,
                                     "sampling": {"max_tokens": 8}})
        if job is not None and job.status_code == 201:
            self.tally.jobs.append(("evaluation", job.json()["id"], self.key))

    async def normal(self, until: float, rng: random.Random, sandboxes: bool) -> None:
        while time.monotonic() < until:
            pick = rng.random()
            if pick < 0.003 and self.budget["training"] > 0:
                self.budget["training"] -= 1
                await self.train()
            elif pick < 0.006 and self.budget["evaluation"] > 0:
                self.budget["evaluation"] -= 1
                await self.evaluate()
            elif pick < 0.03 and sandboxes:
                await self.sandbox()
            elif pick < 0.50:
                await self.chat()
            elif pick < 0.70:
                await self.stream()
            elif pick < 0.85:
                await self.balance()
            else:
                await self.records()
            await asyncio.sleep(rng.uniform(0.0, 0.2))


def big_body(port: int, key: str, chunked: bool) -> tuple[float, str]:
    """64 MiB on a JSON route, declared (Content-Length) or chunked: the gateway should answer
    413 before it holds more than its limit."""
    t0 = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if not chunked:
        headers["Content-Length"] = str(64 * MiB)
    answer = push(port, "POST", CHAT, headers, repeat(b"x" * 65536, 64 * MiB), chunked=chunked, answer_timeout=60)
    kind = (answer.body or {}).get("error", {}).get("type", "none") if answer.status else "closed"
    return time.perf_counter() - t0, f"{answer.status} {kind} after {answer.sent // MiB} MiB"


async def abusive(kind: str, client: Client, port: int, until: float) -> None:
    nested = b'{"model":"teacher","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    chunked = False
    while time.monotonic() < until:
        if kind == "slow reader":
            await client.stream(stall_s=min(15.0, max(0.5, until - time.monotonic())))  # ends with the mix
        elif kind == "big body":
            chunked = not chunked
            seconds, what = await asyncio.to_thread(big_body, port, client.key, chunked)
            route = "abuse.big_body.chunked" if chunked else "abuse.big_body.declared"
            client.tally.add(route, seconds, what.split(" after")[0])
        else:
            await client.timed("abuse.nested_json", "POST", CHAT, content=nested,
                               headers={"Content-Type": "application/json"})
        await asyncio.sleep(0.5)


def probe_healthz(url: str, stop: threading.Event, samples: list[float]) -> None:
    """In its own thread (its own connection): what a load balancer's health check sees."""
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                client.get("/healthz").raise_for_status()
                samples.append(time.perf_counter() - t0)
            except httpx.HTTPError:
                samples.append(float("inf"))
            time.sleep(0.05)


async def mix(gym: GymProcess, keys: list[str], seconds: float, sandboxes: bool, evaluation: bool, training: bool,
              abuse: bool, healthz: list[float]) -> Tally:
    tally = Tally()
    stop = threading.Event()
    probe = threading.Thread(target=probe_healthz, args=(gym.url, stop, healthz), daemon=True)
    heavy = asyncio.Semaphore(2)
    budget = {"training": 2 if training else 0, "evaluation": 2 if evaluation else 0}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=gym.url, timeout=120, limits=limits) as http:
        clients = [Client(http, key, tally, heavy, budget) for key in keys]
        until = time.monotonic() + seconds
        abusers = (["slow reader"] * 4 + ["big body"] * 3 + ["nested"] * 3) if abuse else []
        tasks = [abusive(kind, clients[i], gym.port, until) for i, kind in enumerate(abusers[: len(clients) // 5])]
        tasks += [c.normal(until, random.Random(i), sandboxes) for i, c in enumerate(clients[len(tasks):])]
        probe.start()
        started = time.monotonic()
        await asyncio.gather(*tasks)
        tally.add("(mix wall time)", time.monotonic() - started, "done")
    stop.set()
    probe.join()
    return tally


def settle_jobs(url: str, tally: Tally, wait_s: float) -> list[str]:
    """Wait for the mix's jobs to end (their owners cancel what still runs after ``wait_s``)."""
    notes: list[str] = []
    left = list(tally.jobs)
    deadline = time.monotonic() + wait_s
    with httpx.Client(base_url=url, timeout=60) as http:
        while left:
            still = []
            for service, job, key in left:
                row = http.get(f"/{service}/v1/jobs/{job}", headers={"Authorization": f"Bearer {key}"}).json()
                if row.get("status") in FINAL:
                    error = row.get("error")
                    notes.append(f"{service} {job}: {row['status']}" + (f" ({str(error)[:160]})" if error else ""))
                else:
                    still.append((service, job, key))
            left = still
            if left and time.monotonic() > deadline:
                for service, job, key in left:
                    http.post(f"/{service}/v1/jobs/{job}/cancel", headers={"Authorization": f"Bearer {key}"})
                    notes.append(f"{service} {job}: still running after {wait_s:.0f} s, cancelled")
                deadline = time.monotonic() + 60  # the cancellation itself: then they must be final
                wait_s = 60
            time.sleep(2 if left else 0)
    return notes


def reconcile(data_dir: Path, url: str, keys: list[tuple[str, str]]) -> list[str]:
    """Every discrepancy between the keys' figures, their ledger rows and /v1/balance."""
    from sqlalchemy import create_engine, text

    from storage.store import sqlite_url

    problems: list[str] = []
    engine = create_engine(sqlite_url(data_dir))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, parent_id, budget_nusd, spent_nusd, reserved_nusd FROM api_keys")).all()
        ledger = conn.execute(text("SELECT key_id, status, estimate_nusd, actual_nusd FROM ledger")).all()
    engine.dispose()
    parent = {r.id: r.parent_id for r in rows}

    def chain(key_id: str) -> list[str]:
        out = [key_id]
        while parent.get(out[-1]):
            out.append(parent[out[-1]])
        return out

    spent: collections.Counter[str] = collections.Counter()
    held: collections.Counter[str] = collections.Counter()
    for entry in ledger:
        for kid in chain(entry.key_id):
            if entry.status == "reserved":
                held[kid] += entry.estimate_nusd
            elif entry.status in ("settled", "expired"):
                spent[kid] += entry.actual_nusd or 0
    open_rows = sum(1 for e in ledger if e.status == "reserved")
    if open_rows:
        problems.append(f"{open_rows} reservation(s) still held")
    for r in rows:
        if r.spent_nusd != spent[r.id]:
            problems.append(f"{r.id}: spent {r.spent_nusd} nUSD but its closed ledger rows sum to {spent[r.id]}")
        if r.reserved_nusd != held[r.id]:
            problems.append(f"{r.id}: reserved {r.reserved_nusd} nUSD but its open rows sum to {held[r.id]}")
        if r.spent_nusd < 0 or r.reserved_nusd < 0 or (r.budget_nusd is not None
                                                       and r.budget_nusd - r.spent_nusd - r.reserved_nusd < 0):
            problems.append(f"{r.id}: negative figures {r.budget_nusd} - {r.spent_nusd} - {r.reserved_nusd}")
    by_id = {r.id: r for r in rows}
    with httpx.Client(base_url=url, timeout=60) as http:
        for key, kid in keys:
            balance = http.get("/v1/balance", headers={"Authorization": f"Bearer {key}"}).json()
            row = by_id.get(kid)
            if row is None:
                problems.append(f"{kid}: not found in the store")
                continue
            remaining = (row.budget_nusd - row.spent_nusd - row.reserved_nusd) / 1e9
            if abs(balance["remaining_usd"] - remaining) > 1e-9 or abs(balance["spent_usd"] - row.spent_nusd / 1e9) > 1e-9:
                problems.append(f"{kid}: /v1/balance {balance} but budget - spent - reserved = {remaining}")
    return problems


def report(tally: Tally, healthz_idle: list[float], healthz_mix: list[float], seconds: float) -> None:
    by_route: dict[str, list[float]] = collections.defaultdict(list)
    outcomes: collections.Counter[tuple[str, str]] = collections.Counter()
    wall = next((s for r, s, _ in tally.calls if r == "(mix wall time)"), seconds)
    for route, elapsed, outcome in tally.calls:
        if route.startswith("("):
            continue
        by_route[route].append(elapsed)
        outcomes[(route, outcome)] += 1
    total = sum(len(v) for v in by_route.values())
    legit = sum(len(v) for r, v in by_route.items() if not r.startswith("abuse."))
    print(f"load mix: {total} calls in {wall:.1f} s = {total / wall:.1f} calls/s "
          f"({legit / wall:.1f} calls/s from well-behaved clients)")
    print(f"  {'route':<24} {'calls':>6}  latency")
    for route in sorted(by_route):
        print(f"  {route:<24} {len(by_route[route]):>6}  {summary(by_route[route])}")
    print("  outcomes by route (status and error type; 2xx: the status):")
    for route in sorted(by_route):
        parts = [f"{o} ×{n}" for (r, o), n in sorted(outcomes.items()) if r == route]
        print(f"    {route:<22} {', '.join(parts)}")
    errors = collections.Counter(o for (_, o), n in outcomes.items() for _ in range(n) if not o[:1] == "2" and o != "done")
    print("  errors by type: " + (", ".join(f"{o} ×{n}" for o, n in errors.most_common()) or "none"))
    finite = [s for s in healthz_mix if s != float("inf")]
    print(f"/healthz idle      : {summary(healthz_idle)}  ({len(healthz_idle)} probes)")
    print(f"/healthz under mix : {summary(finite)}  ({len(healthz_mix)} probes, {len(healthz_mix) - len(finite)} failed)")
    print(f"  ratio mix/idle: p50 {pct(finite, 50) / pct(healthz_idle, 50):.2f}x  "
          f"p99 {pct(finite, 99) / pct(healthz_idle, 99):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--baseline-seconds", type=float, default=8.0)
    parser.add_argument("--job-wait", type=float, default=180.0, help="seconds to wait for jobs after the mix")
    parser.add_argument("--no-jobs", action="store_true", help="no training or evaluation (to attribute latency)")
    parser.add_argument("--no-sandboxes", action="store_true", help="no sandboxes (to attribute latency)")
    parser.add_argument("--no-abuse", action="store_true", help="no abusive clients (to attribute latency)")
    args = parser.parse_args()

    sandboxes = shutil.which("bwrap") is not None and not args.no_sandboxes
    provider_key = "sk-bench-" + secrets.token_hex(8)
    os.environ["BENCH_TEACHER_KEY"] = provider_key  # the gym process inherits it (its provider secret)
    with standin_process(provider_key) as provider, tempfile.TemporaryDirectory(prefix="rsigym-load-") as tmp:
        config = f"""
[[rollout.models]]
name = "teacher"
litellm_model = "openai/teacher"
api_base = "{provider}/v1"
api_key_env = "BENCH_TEACHER_KEY"
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"""
        data = Path(tmp) / "data"
        with gym_process(data, config) as gym, httpx.Client(base_url=gym.url, timeout=60) as http:
            evaluation = False
            if sandboxes and not args.no_jobs:
                bench_dir = mini_benchmark(Path(tmp), name="loadmini", per_split=1)
                r = http.post("/admin/v1/benchmarks", json={"path": str(bench_dir)}, headers=ADMIN)
                deadline = time.monotonic() + 300
                while r.status_code == 201 and time.monotonic() < deadline:
                    rows = {b["name"]: b for b in http.get("/admin/v1/benchmarks", headers=ADMIN).json()["data"]}
                    if rows["loadmini"]["status"] != "validating":
                        evaluation = rows["loadmini"]["status"] == "ready"
                        break
                    time.sleep(1)
            keys: list[tuple[str, str]] = []
            for _ in range(args.keys):
                made = http.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 5.0}, headers=ADMIN)
                made.raise_for_status()
                keys.append((made.json()["key"], made.json()["id"]))
            print(f"gym pid {gym.pid}, {len(keys)} keys, sandboxes {'on' if sandboxes else 'off'}, "
                  f"abusive clients {'off' if args.no_abuse else 'on'}, "
                  f"training {'off' if args.no_jobs else 'on'}, evaluation {'on' if evaluation else 'off'}, "
                  f"{args.seconds:.0f} s of mixed traffic")
            t0 = time.perf_counter()  # warm up: the first rollout call imports the provider client
            for stream in (False, True, False):
                warm = http.post(CHAT, json={"model": "teacher", "messages": MESSAGES, "max_tokens": 8, "stream": stream},
                                 headers={"Authorization": f"Bearer {keys[0][0]}"}, timeout=120)
                warm.raise_for_status()
            print(f"warm-up (first rollout calls of a fresh gym): {time.perf_counter() - t0:.1f} s")
            idle: list[float] = []
            stop = threading.Event()
            probe = threading.Thread(target=probe_healthz, args=(gym.url, stop, idle), daemon=True)
            probe.start()
            time.sleep(args.baseline_seconds)
            stop.set()
            probe.join()
            healthz: list[float] = []
            tally = asyncio.run(mix(gym, [k for k, _ in keys], args.seconds, sandboxes, evaluation, not args.no_jobs,
                                    not args.no_abuse, healthz))
            report(tally, idle, healthz, args.seconds)
            for note in settle_jobs(gym.url, tally, args.job_wait):
                print(f"  job {note}")
            time.sleep(1)
            problems = reconcile(data, gym.url, keys)
            print("ledger: RECONCILED (per key: budget - spent - reserved == remaining, spent == closed rows, "
                  "nothing held, nothing negative)" if not problems else "ledger: DISCREPANCY")
            for problem in problems[:50]:
                print(f"  {problem}")


if __name__ == "__main__":
    main()
