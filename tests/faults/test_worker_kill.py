"""Scenario 3: a Celery worker (``rsigym worker``) is ``kill -9``-ed in the middle of a training job
and, later, in the middle of an evaluation job (distributed mode: PostgreSQL, Redis; the
services and the gateway in this process, the workers as their own processes).

The gym notices a dead worker by its job's heartbeat (jobs/lifecycle.py): a running job
whose ``heartbeat_at`` is older than ``RSIGYM_JOBS_HEARTBEAT_TTL_S`` is reaped by the next round
of any reaper (the services' and every worker's, each ``RSIGYM_JOBS_REAP_INTERVAL_S``) — here
within 6 + 2 s of the kill (production defaults: 30 + 10 s), with no worker alive at all. Both
kinds are resumable: the job goes back to the queue and the next worker finishes it.

* training: killed two or more steps after its first checkpoint; the next worker continues from
  that checkpoint (steps go on from it, the steps after it that were billed run again with the
  same losses and are not billed again), the hold of the step it was in is released, every step
  is billed once, one ``training.job`` event lists the checkpoints of both workers;
* evaluation: each trial is recorded once.

Afterwards the ledgers sum to what the keys spent, nothing is held, no job is ``running``, and
the gym serves other runs (a second run's training job succeeds on the new worker).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

import rsigym
from kit.settings import GymSettings, StoreSettings
from ops.builder import build_gateway, build_service
from services.evaluation.tables import EvaluationJob
from services.records.events import TRAINING_JOB, RecordEvent
from services.training.checkpoints import Checkpoint
from services.training.tables import TrainingJob, TrainingStep
from storage.store import Store
from storage.tables import LedgerEntry
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, PG_URL, admin_headers, require_redis
from tests.fakes.live_gym import harness_archive, mini_benchmark
from tests.fakes.servers import free_port, serve
from tests.faults.conftest import Procs, assert_ledger_sound, until
from tests.integration.jobs.test_distributed_jobs import _close, _forget_queues

pytestmark = [pytest.mark.postgres, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (evaluation trials)")]

REDIS_URL = os.environ.get("RSIGYM_TEST_REDIS_URL", "redis://127.0.0.1:6379/12")
TTL_S, REAP_S = 6, 2
TRAIN_STEPS, EVERY = 120, 40
ROWS = [{"messages": [{"role": "user", "content": f"What is {i} - 1?"}, {"role": "assistant", "content": str(i - 1)}]}
        for i in range(2, 34)]


class Cluster:
    def __init__(self, url: str, procs: Procs, store: Store):
        self.url, self.procs, self.store = url, procs, store
        self.admin = httpx.Client(base_url=url, headers=admin_headers(), timeout=120)
        self.workers = 0

    def start_worker(self) -> str:
        self.workers += 1
        name = f"worker-{self.workers}"
        self.procs.spawn(name, "worker", "--queues", "training,evaluation", "--concurrency", "2")
        return name

    def run(self) -> tuple[dict[str, Any], rsigym.Gym]:
        key = self.admin.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 5.0}).json()
        return key, rsigym.Gym(base_url=self.url, api_key=key["key"], timeout=120)

    def holder(self, table: Any, job_id: str) -> str | None:
        with self.store.transaction() as s:
            return s.scalar(select(table.worker).where(table.id == job_id))

    def progress(self, job_id: str) -> tuple[int, int]:
        """(the job's step, the step of its newest checkpoint or 0), from the store."""
        with self.store.transaction() as s:
            step = s.scalar(select(TrainingJob.step).where(TrainingJob.id == job_id)) or 0
            saved = s.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id)) or 0
        return step, saved

    def steps(self, job_id: str) -> dict[int, tuple[float, int]]:
        """step -> (loss, cost billed) of the job's rows in the steps table."""
        with self.store.transaction() as s:
            return {n: (loss, cost) for n, loss, cost in s.execute(
                select(TrainingStep.step, TrainingStep.loss, TrainingStep.cost_nusd).where(TrainingStep.job_id == job_id))}

    def running_jobs(self) -> int:
        with self.store.transaction() as s:
            return sum(s.scalar(select(func.count()).select_from(t).where(t.status == "running")) or 0
                       for t in (TrainingJob, EvaluationJob))


@pytest.fixture
def cluster(tmp_path: Path, pg_schema: str, procs: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    require_redis(REDIS_URL)
    store_url = f"{PG_URL}?options=-csearch_path%3D{pg_schema}"
    port = free_port()
    prefix = f"f{secrets.token_hex(4)}."
    env = {"RSIGYM_DATA_DIR": str(tmp_path / "data"), "RSIGYM_MODELS_DIR": str(MODELS_DIR),
           "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN, "RSIGYM_INTERNAL_SECRET": "faults-" + secrets.token_hex(8),
           "RSIGYM_GATEWAY_URL": f"http://127.0.0.1:{port}", "RSIGYM_STORE_URL": store_url,
           "RSIGYM_JOBS_BACKEND": "celery", "RSIGYM_WORKER_BROKER_URL": REDIS_URL, "RSIGYM_WORKER_QUEUE_PREFIX": prefix,
           "RSIGYM_JOBS_HEARTBEAT_INTERVAL_S": "1", "RSIGYM_JOBS_HEARTBEAT_TTL_S": str(TTL_S),
           "RSIGYM_JOBS_REAP_INTERVAL_S": str(REAP_S), "OMP_NUM_THREADS": "1", "RSIGYM_CONFIG": str(tmp_path / "gym.toml")}
    (tmp_path / "gym.toml").write_text("[evaluation]\ntrial_concurrency = 1\n")  # one trial after another
    for name, value in env.items():  # the services in this process send jobs to Celery and reap as well
        monkeypatch.setenv(name, value)
    store = Store(store_url, StoreSettings())
    store.migrate()
    settings = GymSettings()
    with ExitStack() as stack:
        stack.callback(store.dispose)
        stack.callback(_forget_queues, REDIS_URL, prefix)
        urls: dict[str, str] = {}
        for name in ("training", "inference", "sandbox", "evaluation"):
            app = build_service(name, settings, store_settings=StoreSettings())
            stack.callback(_close, name, app)
            urls[name] = stack.enter_context(serve(app))
        gym = build_gateway(settings, StoreSettings(), urls)
        url = stack.enter_context(serve(gym.app, port=port))
        p = procs(env)
        stack.callback(p.stop)
        yield Cluster(url, p, store)


def _kill_holder(c: Cluster, table: Any, job_id: str) -> float:
    holder = c.holder(table, job_id)
    assert holder is not None
    pid = int(holder.split(":")[1])
    victim = next(name for name, proc in c.procs.procs.items() if proc.pid == pid)
    c.procs.kill9(victim)
    return time.monotonic()


def test_worker_killed_mid_training_and_mid_evaluation(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    c.start_worker()
    r = c.admin.post("/admin/v1/benchmarks", json={"path": str(mini_benchmark(tmp_path / "bench", per_split=1))})
    assert r.status_code == 201, r.text
    key, gym = c.run()

    # -- mid-training: killed past its first checkpoint, resumed from it by the next worker -----
    dataset = gym.training.upload_dataset(ROWS, name="minus-one")
    job = gym.training.create_job(datasets=[dataset.id], base_model="tiny", steps=TRAIN_STEPS, batch_size=2,
                                  max_length=32, checkpoint_every=EVERY, seed=1)
    until("two steps past a checkpoint", lambda: (p := c.progress(job.id))[1] and p[0] >= p[1] + 2,
          timeout=300, poll=0.05)
    killed_at = _kill_holder(c, TrainingJob, job.id)
    lost = c.steps(job.id)  # what the dead worker had written: step -> (loss, cost)
    _, resume_at = c.progress(job.id)
    requeued = until("the dead worker's training job re-queued",
                     lambda: (j := gym.training.get_job(job.id)).status != "running" and j, timeout=TTL_S + REAP_S + 20)
    print(f"\ntraining job of the killed worker re-queued {time.monotonic() - killed_at:.1f} s after the kill "
          f"(bound: heartbeat_ttl_s {TTL_S} + reap_interval_s {REAP_S}), {len(lost)} steps done, "
          f"checkpoint at step {resume_at}")
    assert requeued.status == "queued" and len(lost) < TRAIN_STEPS, requeued  # no worker is alive: it waits
    assert_ledger_sound(c.store, key["id"])  # the hold of the step it was in is released, not charged
    c.start_worker()  # the replacement continues it
    trained = gym.training.wait(job.id, timeout=300, poll=0.5)
    assert (trained.status, trained.step) == ("succeeded", TRAIN_STEPS), (trained, c.procs.log("worker-2"))
    after = c.steps(job.id)
    assert sorted(after) == list(range(1, TRAIN_STEPS + 1))  # every step once
    replayed = range(resume_at + 1, max(lost) + 1)  # billed by the dead worker, run again from the checkpoint
    assert [after[n][1] for n in replayed] == [lost[n][1] for n in replayed]  # at the cost billed once
    assert [after[n][0] for n in replayed] == pytest.approx([lost[n][0] for n in replayed], rel=1e-4, abs=1e-6)
    ckpt = next(ck for ck in gym.training.checkpoints() if ck.job_id == job.id and ck.step == resume_at)
    assert f"resumed (taken 2 times) from checkpoint {ckpt.id} at step {resume_at}" in gym.training.logs(job.id)
    with c.store.transaction() as s:
        billed = s.execute(select(LedgerEntry.status, func.count(), func.coalesce(func.sum(LedgerEntry.actual_nusd), 0))
                           .where(LedgerEntry.ref_id == job.id).group_by(LedgerEntry.status)).all()
        final = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step == TRAIN_STEPS)).one()
        outputs = list(s.scalars(select(Checkpoint.id).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step)))
        events = [e.data for e in s.scalars(select(RecordEvent).where(RecordEvent.run_id == key["id"],
                                                                        RecordEvent.kind == TRAINING_JOB))]
    by_status = {status: (n, int(charged or 0)) for status, n, charged in billed}
    # each step billed once (the held step the worker died in, if any, released, not charged)
    assert by_status.pop("settled") == (TRAIN_STEPS, sum(cost for _, cost in after.values())), billed
    assert set(by_status) <= {"released"} and by_status.get("released", (0, 0))[1] == 0, billed
    assert (final.job_id, final.parent_checkpoint_id) == (job.id, None)  # the job's provenance, both workers'
    assert [(e["job_id"], e["status"], e["resumes"], e["output_checkpoints"]) for e in events] == [
        (job.id, "succeeded", 1, outputs)] and ckpt.id in outputs
    assert_ledger_sound(c.store, key["id"])

    # -- mid-evaluation: a harness that takes its time, so the kill lands between trials -------
    bench = until("benchmark validated", lambda: next((b for b in c.admin.get("/admin/v1/benchmarks").json()["data"]
                                                       if b["name"] == "mini" and b["status"] != "validating"), None),
                  timeout=300, poll=1)
    assert bench["status"] == "ready", (bench, c.procs.log("worker-1"), c.procs.log("worker-2"))
    harness = gym.evaluation.upload_harness(harness_archive("slow", "sleep 2\necho 0\n"))
    evaluation = gym.evaluation.run("mini", model="tiny", split="dev", harness=harness.id, attempts=3)
    done_at_kill = until("evaluation running with a trial done",
                         lambda: gym.evaluation.get(evaluation.id).status == "running"
                         and len(list(gym.evaluation.results(evaluation.id))), timeout=300, poll=0.5)
    killed_at = _kill_holder(c, EvaluationJob, evaluation.id)
    assert done_at_kill < 3  # trials run one after another: the kill lands mid-evaluation
    status = until("the dead worker's evaluation left 'running'",
                   lambda: (st := gym.evaluation.get(evaluation.id).status) != "running" and st,
                   timeout=TTL_S + REAP_S + 20)
    print(f"evaluation of the killed worker re-queued {time.monotonic() - killed_at:.1f} s after the kill")
    assert status == "queued"  # no worker is alive: it waits for the next one
    c.start_worker()  # the replacement finishes it
    other_key, other = c.run()  # and another run is served meanwhile
    other_job = other.training.create_job(datasets=[other.training.upload_dataset(ROWS).id], base_model="tiny", steps=2,
                                          batch_size=2, max_length=32, seed=2)
    done = gym.evaluation.wait(evaluation.id, timeout=300)
    assert done.status == "succeeded", (done, c.procs.log("worker-3"))
    attempts = sorted(r.attempt for r in gym.evaluation.results(evaluation.id))
    assert attempts == [1, 2, 3], attempts  # each trial recorded once, none lost with the worker
    assert other.training.wait(other_job.id, timeout=300, poll=1).status == "succeeded"

    assert c.running_jobs() == 0
    assert_ledger_sound(c.store, key["id"])
    assert_ledger_sound(c.store, other_key["id"])
