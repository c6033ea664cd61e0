"""Evaluation scaling: one 200-trial evaluation job, run by 1 worker process and by 4.

The job is a real evaluation job on the real runner (services/evaluation/jobs.py): a registered
benchmark (20 arithmetic tasks × 10 attempts), keys minted per worker, every trial claimed in the
store before it runs and its result written as it ends, the score computed from the rows. Each
worker is its own process running one trial at a time, as a Celery worker's ``assist`` task does
(the first to claim the job owns and finishes it; the others share its trials through the store).
Only the trial itself is cheap: each one really runs a short command in a fresh bubblewrap sandbox
(no network, read-only system, private /tmp) — a wait of ``--delay`` seconds, like a trial waiting
on its model or verifier, then it prints the reward — instead of a Harbor trial with a model
behind it. The figure is trials per second (job start to job end, from the store) at 1 and at 4
workers, and their ratio (target ≥ 3×).

    .venv/bin/python bench/eval_scaling.py [--trials 200] [--delay 0.3] [--workers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

if __package__ in (None, ""):  # run as a script: the project root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from access.keys import KeyRegistry
from access.presets import preset_policy
from billing.money import usd_to_nusd
from jobs.lifecycle import PoolDispatcher
from kit.config import GymConfig
from kit.ids import new_id
from kit.settings import StoreSettings
from services.evaluation.harnesses import HarnessStore
from services.evaluation.jobs import EvaluationRunner
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.schemas import MINIMAL
from services.evaluation.tables import EvaluationJob, TrialResultRow
from services.evaluation.trials import TrialOutcome, TrialRequest
from storage.store import Store, sqlite_url
from tests.fakes.live_gym import mini_benchmark

SANDBOX = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr",
           "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
           "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]


@dataclass
class SandboxedCommandTrial:
    """A trial runner: a short command in a fresh bubblewrap sandbox. Reward = what it prints:
    1 on odd attempts, 0 on even ones, so a job's avg@k is exactly 0.5 when every trial ran once."""

    delay_s: float
    calls: int = 0

    async def __call__(self, req: TrialRequest) -> TrialOutcome:
        self.calls += 1
        started = datetime.now(UTC).isoformat()
        script = f"sleep {self.delay_s}; echo $(( {req.attempt} % 2 ))"
        proc = await asyncio.create_subprocess_exec(*SANDBOX, "/bin/sh", "-c", script,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        ok = proc.returncode == 0
        return TrialOutcome(task_id=req.task.id, attempt=req.attempt, reward=float(out.decode().strip()) if ok else None,
                            trajectory=None, verifier_output=out.decode(), agent_output=err.decode()[-2000:],
                            error=None if ok else f"sandbox exited {proc.returncode}", sandbox_id=None,
                            started_at=started, finished_at=datetime.now(UTC).isoformat(), result_path=None)


@dataclass
class Outcome:
    seconds: float
    """From the job's start to its end, as the store recorded them."""
    status: str
    score: float | None
    trials: int
    distinct: int
    runner_calls: list[int]
    """Trials each worker ran."""


def prepare_job(store: Store, data_dir: Path, *, name: str, tasks_per_split: int, attempts: int) -> str:
    """Register a mini benchmark and queue one evaluation job of 2·tasks_per_split·attempts trials."""
    registry = BenchmarkRegistry(store, data_dir / "benchmarks")
    row, bench = registry.register(mini_benchmark(data_dir / "src", name=name, per_split=tasks_per_split))
    task_ids = [t.id for _split, t in bench.tasks()]
    key, _secret = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=usd_to_nusd(5.0),
                                             track="joint", name="eval-scaling")
    job_id = new_id("evj")
    with store.transaction() as s:
        s.add(EvaluationJob(id=job_id, run_id=key["id"], key_id=key["id"], purpose="agent", benchmark=row.name,
                            split="*", model="tiny", harness=MINIMAL, attempts=attempts, sampling={},
                            task_ids=task_ids, gateway_url="", trials_total=len(task_ids) * attempts))
    return job_id


def worker_process(store_url: str, schema: str | None, data_dir: str, job_id: str, delay_s: float,
                   ready: Any, start: Any, results: Any) -> None:
    """One evaluation worker in its own process: the runner a worker builds, one trial at a time,
    sharing the job with the others through the store alone (the first to claim it owns it)."""
    store = Store(store_url, StoreSettings(), schema=schema)
    root = Path(data_dir)
    trial = SandboxedCommandTrial(delay_s)
    runner = EvaluationRunner(store, BenchmarkRegistry(store, root / "benchmarks"), HarnessStore(store, root / "harnesses"),
                              root / "trials", trial_concurrency=1, runner=trial,
                              gateway_url=lambda: "http://127.0.0.1:9", dispatcher=PoolDispatcher(1, "bench-eval"))
    ready.put(True)
    start.wait()
    try:
        runner.assist(job_id)
    finally:
        results.put(trial.calls)
        runner.dispatcher.shutdown()  # not runner.shutdown(): embedded, that would cancel the others' job
        store.dispose()


def run_job(store: Store, data_dir: Path, *, tasks_per_split: int, attempts: int, workers: int,
            delay_s: float) -> Outcome:
    """One job run by ``workers`` worker processes; returns what the store says about it."""
    job_id = prepare_job(store, data_dir, name=f"scale{workers}", tasks_per_split=tasks_per_split, attempts=attempts)
    ctx = multiprocessing.get_context("spawn")
    ready, start, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=worker_process, args=(store.url, store.schema, str(data_dir), job_id, delay_s,
                                                      ready, start, results)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    for _ in procs:  # every worker is up before the job may start
        ready.get(timeout=300)
    start.set()
    calls = [results.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    with store.transaction() as s:
        job = s.get(EvaluationJob, job_id)
        assert job is not None and job.started_at is not None and job.finished_at is not None
        rows = s.execute(select(TrialResultRow.task_id, TrialResultRow.attempt)
                         .where(TrialResultRow.job_id == job_id)).all()
        seconds = (job.finished_at - job.started_at).total_seconds()
        return Outcome(seconds, job.status, job.score, len(rows), len({tuple(r) for r in rows}), calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200, help="a multiple of 20 (20 tasks × attempts)")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds each sandboxed trial waits")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("needs bubblewrap (bwrap) for the trial sandboxes")
    tasks_per_split = 10
    attempts = max(1, args.trials // (2 * tasks_per_split))
    print(f"one evaluation job: {2 * tasks_per_split} tasks × {attempts} attempts = "
          f"{2 * tasks_per_split * attempts} trials, each a {args.delay:.2f} s command in a bubblewrap sandbox")
    rates: dict[int, float] = {}
    for workers in (1, args.workers):
        with tempfile.TemporaryDirectory(prefix="rsigym-evalscale-") as tmp:
            store = Store(sqlite_url(Path(tmp)), StoreSettings())
            store.migrate()
            out = run_job(store, Path(tmp), tasks_per_split=tasks_per_split, attempts=attempts, workers=workers,
                          delay_s=args.delay)
            store.dispose()
        rates[workers] = out.trials / out.seconds
        print(f"{workers} worker{'s' if workers > 1 else ' '}: {out.trials} trials in {out.seconds:6.2f} s = "
              f"{rates[workers]:6.2f} trials/s  (status {out.status}, score {out.score}, "
              f"trials per worker {sorted(out.runner_calls, reverse=True)})")
    ratio = rates[args.workers] / rates[1]
    print(f"ratio {args.workers} workers / 1 worker: {ratio:.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()
