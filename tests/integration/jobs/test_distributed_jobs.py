"""Distributed jobs for real: two gateway processes and two Celery worker processes (`rsigym
worker`) over one PostgreSQL schema and Redis, with the training, inference, sandbox and
evaluation services served on loopback (signed calls only, as in production).

Training and evaluation jobs go in through gateway A and gateway B and run on the workers (the
benchmark's validation too). One worker is ``kill -9``-ed while it is writing training steps:
the job goes back to the queue (reaped by the surviving side once its heartbeat is stale) —
never stuck ``running`` — and the other worker finishes it (tests/faults/test_worker_kill.py
checks the resume from a checkpoint step by step); each step is billed once, no ledger hold
stays ``reserved``, the ledger sums to what the key has spent, and other jobs keep running on
the other worker.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import func, select

import rsigym
from kit.settings import GymSettings, StoreSettings
from ops.builder import build_service
from services.training.tables import TrainingJob
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, PG_URL, admin_headers, require_redis
from tests.fakes.live_gym import mini_benchmark
from tests.fakes.servers import free_port, serve

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (evaluation trials)")]

ROOT = Path(__file__).resolve().parents[3]
REDIS_URL = os.environ.get("RSIGYM_TEST_REDIS_URL", "redis://127.0.0.1:6379/12")
LONG_STEPS = 150
ROWS = [{"messages": [{"role": "user", "content": f"What is {i} - 1?"}, {"role": "assistant", "content": str(i - 1)}]}
        for i in range(2, 66)]


@pytest.fixture
def redis_url() -> str:
    return require_redis(REDIS_URL)


class Cluster:
    def __init__(self, tmp: Path, schema: str, redis_url: str):
        self.tmp, self.schema = tmp, schema
        self.store_url = f"{PG_URL}?options=-csearch_path%3D{schema}"
        self.port_a, self.port_b = free_port(), free_port()
        self.url_a, self.url_b = f"http://127.0.0.1:{self.port_a}", f"http://127.0.0.1:{self.port_b}"
        self.env = {
            "RSIGYM_DATA_DIR": str(tmp / "data"), "RSIGYM_MODELS_DIR": str(MODELS_DIR),
            "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN, "RSIGYM_INTERNAL_SECRET": "distributed-" + secrets.token_hex(8),
            "RSIGYM_GATEWAY_URL": self.url_a, "RSIGYM_STORE_URL": self.store_url,
            "RSIGYM_JOBS_BACKEND": "celery", "RSIGYM_WORKER_BROKER_URL": redis_url,
            "RSIGYM_WORKER_QUEUE_PREFIX": f"t{secrets.token_hex(4)}.",
            "RSIGYM_JOBS_HEARTBEAT_INTERVAL_S": "1", "RSIGYM_JOBS_HEARTBEAT_TTL_S": "8", "RSIGYM_JOBS_REAP_INTERVAL_S": "2",
            "OMP_NUM_THREADS": "1",
        }
        config = tmp / "gym.toml"
        config.write_text("[evaluation]\nworkers_per_job = 2\n")  # each evaluation also sends a helper task
        self.env["RSIGYM_CONFIG"] = str(config)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = tmp / "logs"
        self.logs.mkdir()

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        out = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed when the process is reaped
        proc = subprocess.Popen([sys.executable, "-m", "ops.cli.main", *args], cwd=ROOT,
                                env={**os.environ, **self.env}, stdout=out, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what} did not come up in {timeout} s")


def until(what: str, check: Any, timeout: float, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout} s")


@pytest.fixture
def cluster(tmp_path: Path, pg_schema: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    c = Cluster(tmp_path, pg_schema, redis_url)
    for name, value in c.env.items():  # the in-process services send their jobs to Celery as well
        monkeypatch.setenv(name, value)
    store = Store(c.store_url, StoreSettings())
    store.migrate()  # once, before the processes start
    store.dispose()
    settings = GymSettings()
    with ExitStack() as stack:
        stack.callback(c.stop)
        urls: dict[str, str] = {}
        apps = {}
        for name in ("training", "inference", "sandbox", "evaluation"):
            apps[name] = build_service(name, settings, store_settings=StoreSettings())
            urls[name] = stack.enter_context(serve(apps[name]))
        for name, app in apps.items():
            stack.callback(_close, name, app)
        services = [arg for name, url in urls.items() for arg in ("--service", f"{name}={url}")]
        for name, port in (("gateway-a", c.port_a), ("gateway-b", c.port_b)):
            c.spawn(name, "serve", "gateway", *services, "--port", str(port))
        for name in ("worker-1", "worker-2"):
            c.spawn(name, "worker", "--queues", "training,evaluation")
        stack.callback(_forget_queues, redis_url, c.env["RSIGYM_WORKER_QUEUE_PREFIX"])
        wait_http(c.url_a, c.procs["gateway-a"], "gateway A")
        wait_http(c.url_b, c.procs["gateway-b"], "gateway B")
        yield c


def _forget_queues(redis_url: str, prefix: str) -> None:
    """Leave Redis as found: this test's queues, bindings and the killed worker's unacked task."""
    r = redis.Redis.from_url(redis_url)
    for pattern in (f"{prefix}*", f"_kombu.binding.{prefix}*", f"_kombu.binding_permanent.{prefix}*"):
        for name in r.scan_iter(match=pattern):
            r.delete(name)
    for tag, raw in r.hgetall("unacked").items():
        if f'"routing_key": "{prefix}'.encode() in raw:
            r.hdel("unacked", tag)
            r.zrem("unacked_index", tag)


def _close(name: str, app: Any) -> None:
    service = getattr(app.state, name, None)
    runner = getattr(service, "runner", None)
    if runner is not None:
        runner.shutdown()
    if (close := getattr(app.state, "close", None)) is not None:
        close()


def test_jobs_through_two_gateways_on_two_workers_survive_a_kill_9(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    admin_a = httpx.Client(base_url=c.url_a, headers=admin_headers(), timeout=120)
    admin_b = httpx.Client(base_url=c.url_b, headers=admin_headers(), timeout=120)
    # The benchmark is registered through A; its validation job (oracle 1, nop 0) runs on a worker.
    r = admin_a.post("/admin/v1/benchmarks", json={"path": str(mini_benchmark(tmp_path / "bench", per_split=1))})
    assert r.status_code == 201, r.text
    key = admin_b.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 5.0}).json()
    via_a = rsigym.Gym(base_url=c.url_a, api_key=key["key"], timeout=120)
    via_b = rsigym.Gym(base_url=c.url_b, api_key=key["key"], timeout=120)

    # A long training job through gateway A; kill -9 its worker once steps are being written.
    dataset = via_a.training.upload_dataset(ROWS, name="minus-one")
    long_job = via_a.training.create_job(datasets=[dataset.id], base_model="tiny", steps=LONG_STEPS, batch_size=4,
                                         max_length=32, checkpoint_every=50, seed=1)
    until("steps written", lambda: via_b.training.get_job(long_job.id).step >= 3, timeout=300)
    store = Store(c.store_url, StoreSettings())
    try:
        with store.transaction() as s:
            holder = s.scalar(select(TrainingJob.worker).where(TrainingJob.id == long_job.id))
        assert holder is not None
        pid = int(holder.split(":")[1])
        victim = next(name for name, p in c.procs.items() if p.pid == pid and name.startswith("worker"))
        os.kill(pid, signal.SIGKILL)
        c.procs[victim].wait(timeout=10)
        step_at_kill = via_a.training.get_job(long_job.id).step

        # The survivor keeps working: a short training job through B, and an evaluation through B.
        short_job = via_b.training.create_job(datasets=[dataset.id], base_model="tiny", steps=3, batch_size=4,
                                              max_length=32, seed=2)
        bench = until("benchmark validated",
                      lambda: next((b for b in admin_b.get("/admin/v1/benchmarks").json()["data"]
                                    if b["name"] == "mini" and b["status"] != "validating"), None), timeout=600)
        assert bench["status"] == "ready", (bench, c.log("worker-1"), c.log("worker-2"))
        evaluation = via_b.evaluation.run("mini", model="tiny", split="dev", attempts=3)
        short = via_a.training.wait(short_job.id, timeout=600, poll=1)
        assert short.status == "succeeded", (short.error, c.log("worker-1"), c.log("worker-2"))
        done = via_a.evaluation.wait(evaluation.id, timeout=600)
        assert done.status == "succeeded" and done.score is not None, done
        results = via_a.evaluation.results(evaluation.id)
        assert sorted(r.attempt for r in results) == [1, 2, 3]  # each trial recorded once

        # The killed job: re-queued by a reaper once its heartbeat went stale, finished by the survivor.
        long = via_b.training.wait(long_job.id, timeout=300, poll=1)
        assert (long.status, long.step) == ("succeeded", LONG_STEPS), (long, c.log("worker-1"), c.log("worker-2"))
        assert step_at_kill < LONG_STEPS

        with store.transaction() as s:
            subtree = [key["id"], *s.scalars(select(ApiKey.id).where(ApiKey.parent_id == key["id"])).all()]
            held = s.scalar(select(func.count()).select_from(LedgerEntry).where(
                LedgerEntry.key_id.in_(subtree), LedgerEntry.status == "reserved"))
            charged = s.scalar(select(func.coalesce(func.sum(LedgerEntry.actual_nusd), 0)).where(
                LedgerEntry.key_id.in_(subtree)))
            root = s.get(ApiKey, key["id"])
            killed_holds = s.execute(select(LedgerEntry.status, func.count()).where(
                LedgerEntry.ref_id == long_job.id).group_by(LedgerEntry.status)).all()
        assert root is not None
        assert held == 0 and root.reserved_nusd == 0
        assert charged == root.spent_nusd > 0
        assert dict(killed_holds).get("settled", 0) == LONG_STEPS  # each step billed once, none twice
        assert set(dict(killed_holds)) <= {"settled", "released"}  # the step it died in: released, if held

        metrics = admin_b.get("/metrics").text
        assert 'rsigym_jobs_finished_total{kind="training",status="failed"}' not in metrics
        assert 'rsigym_jobs_finished_total{kind="training",status="succeeded"} 2.0' in metrics
        assert 'rsigym_queue_depth{queue="training"} 0.0' in metrics
        assert 'rsigym_queue_oldest_age_seconds{queue="evaluation"}' in metrics
    finally:
        store.dispose()
