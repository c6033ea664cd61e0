"""A platform failure is never the agent's zero (services/evaluation/failures.py, jobs.py).

Found in distributed mode: with the gateway address trials call back on down, an evaluation whose
every trial failed to connect reported ``succeeded, score 0.0000``. Here the evaluation's real
trials (Harbor, the gym's environment) call back on a closed port: the job ends ``failed``, its
error names the platform, it has no score, and no trial is recorded as a 0. A harness that crashes
is the agent's own failure: its trials score 0 and the job succeeds. The gateway killed after a
job's first trial fails the rest on the platform: the job ends failed, unscored; a model door the
platform failed (503 behind it) is not the harness's 0 either.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import select

from access.keys import KeyRegistry
from access.presets import preset_policy
from billing.money import usd_to_nusd
from kit.config import GymConfig
from kit.errors import ServiceUnavailable
from kit.ids import new_id
from ops.dashboard import queries as dashboard
from services.evaluation import jobs as evaluation_jobs
from services.evaluation.harnesses import HarnessStore
from services.evaluation.jobs import TRIAL_RETRIES, EvaluationRunner
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.schemas import MINIMAL
from services.evaluation.service import result_view
from services.evaluation.tables import EvaluationJob, ScoreRow, TrialResultRow
from services.evaluation.trials import TrialOutcome, TrialRequest, run_trial
from storage.store import Store
from tests.fakes.live_gym import mini_benchmark
from tests.fakes.servers import serve_gym


class Recorder:
    """A dispatcher that sends nothing (the test runs the job itself)."""

    def dispatch(self, runner: Any, job_id: str, queue: str, task: str) -> None:
        pass

    def shutdown(self) -> None:
        pass


class CountingRuns:
    """The real trial, counting its runs (the retries)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []

    async def __call__(self, req: TrialRequest) -> TrialOutcome:
        self.runs.append((req.task.id, req.attempt))
        return await run_trial(req)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def evaluation(store: Store, tmp_path: Path, gateway_url: str, *, tasks: int = 2, attempts: int = 2,
               harness_dir: Path | None = None, trials: CountingRuns | None = None,
               concurrency: int = 2) -> tuple[EvaluationRunner, str, CountingRuns]:
    """An agent's evaluation job on the mini benchmark, on a runner whose trials call back on ``gateway_url``."""
    registry = BenchmarkRegistry(store, tmp_path / "benchmarks")
    row, bench = registry.register(mini_benchmark(tmp_path / "src"))
    task_ids = [t.id for _split, t in bench.tasks()][:tasks]
    key, _ = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=usd_to_nusd(2.0),
                                       track="joint")
    job_id = new_id("evj")
    with store.transaction() as s:
        s.add(EvaluationJob(id=job_id, run_id=key["id"], key_id=key["id"], purpose="agent", benchmark=row.name,
                            split="*", model="tiny", harness=MINIMAL, attempts=attempts, sampling={"max_tokens": 8},
                            task_ids=task_ids, gateway_url="", trials_total=len(task_ids) * attempts))
        s.add(ScoreRow(id=new_id("sco"), run_id=key["id"], benchmark=row.name, split="*", model="tiny",
                       harness=MINIMAL, attempts=attempts, job_id=job_id))
    harnesses = HarnessStore(store, tmp_path / "harnesses")
    if harness_dir is not None:
        harnesses.directory = lambda harness, *, run_id: harness_dir  # type: ignore[method-assign]
    trials = trials or CountingRuns()
    runner = EvaluationRunner(store, registry, harnesses, tmp_path / "trials", runner=trials,
                              gateway_url=lambda: gateway_url, dispatcher=Recorder(), trial_concurrency=concurrency)
    return runner, job_id, trials


def finished(store: Store, job_id: str) -> tuple[EvaluationJob, list[TrialResultRow], ScoreRow]:
    with store.transaction() as s:
        job = s.get(EvaluationJob, job_id)
        rows = list(s.scalars(select(TrialResultRow).where(TrialResultRow.job_id == job_id)))
        score = s.scalars(select(ScoreRow).where(ScoreRow.job_id == job_id)).one()
        assert job is not None
        s.expunge_all()
        return job, rows, score


def test_trials_whose_gateway_is_down_fail_the_job_unscored_with_the_platform_named(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluation_jobs, "RETRY_BACKOFF_S", (0.05, 0.05))
    runner, job_id, trials = evaluation(store, tmp_path, f"http://127.0.0.1:{closed_port()}")
    try:
        assert runner.execute(job_id)
    finally:
        runner.shutdown()
    job, rows, score = finished(store, job_id)
    assert job.status == "failed", (job.status, job.error)
    assert job.error and "platform failure" in job.error and "ConnectError" in job.error, job.error
    assert f"after {TRIAL_RETRIES} retries" in job.error
    assert job.score is None and score.score is None and score.status == "failed"
    # every trial it ran was tried again, then recorded as the platform's, none as a 0
    assert rows and all(r.reward is None and r.failure_kind == "platform" for r in rows), rows
    assert all(trials.runs.count((r.task_id, r.attempt)) == 1 + TRIAL_RETRIES for r in rows)
    # it stopped taking trials once one failed for good: not every trial of a dead gym is tried
    assert len(rows) <= job.trials_total and len(trials.runs) <= job.trials_total * (1 + TRIAL_RETRIES)
    assert result_view(rows[0])["failure_kind"] == "platform"  # what the results API shows
    page = dashboard.evaluation_job(store, job_id)  # and the operator's console
    assert {t["failure_kind"] for t in page["trials"]} == {"platform"}
    assert dashboard.trial(store, job_id, page["trials"][0]["id"])["trial"]["failure_kind"] == "platform"
    print(f"\n{job.error}")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_harness_that_crashes_is_the_agents_zero_and_the_job_succeeds(gym: Any, tmp_path: Path) -> None:
    crashing = tmp_path / "crashing-harness"
    crashing.mkdir()
    (crashing / "harness.toml").write_text('[harness]\nname = "crashing"\ninstall = "exit 3"\nrun = "true"\n')
    with serve_gym(gym) as url:
        runner, job_id, trials = evaluation(gym.gateway.store, tmp_path, url, tasks=2, attempts=1,
                                            harness_dir=crashing)
        try:
            assert runner.execute(job_id)
        finally:
            runner.shutdown()
        job, rows, score = finished(gym.gateway.store, job_id)
    assert job.status == "succeeded", (job.status, job.error)
    assert job.score == 0.0 and score.score == 0.0 and score.status == "succeeded"
    assert len(rows) == 2 and all(r.failure_kind == "agent" and "install exited with code 3" in (r.error or "")
                                  for r in rows), [(r.failure_kind, r.error) for r in rows]
    assert len(trials.runs) == 2  # the agent's failure is not retried


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_model_door_the_platform_failed_is_not_the_harness_zero(
        gym: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inference service is down (503) behind a trial's model door: the minimal harness gets no
    answer and scores nothing, and that is recorded as the platform's failure, retried, and the
    job fails unscored naming the door — never a 0 of the harness."""
    from services.inference.service import InferenceService

    async def down(self: Any, identity: Any, body: Any) -> Any:
        raise ServiceUnavailable("the inference backend is down (fault injected)")

    monkeypatch.setattr(InferenceService, "chat", down)
    monkeypatch.setattr(evaluation_jobs, "RETRY_BACKOFF_S", (0.05, 0.05))
    with serve_gym(gym) as url:
        runner, job_id, trials = evaluation(gym.gateway.store, tmp_path, url, tasks=1, attempts=1)
        try:
            assert runner.execute(job_id)
        finally:
            runner.shutdown()
        job, rows, score = finished(gym.gateway.store, job_id)
    assert job.status == "failed" and job.score is None and score.score is None, (job.status, job.error)
    assert job.error and "platform failure" in job.error and "model door failed" in job.error, job.error
    assert "HTTP 503" in job.error
    assert rows and all(r.reward is None and r.failure_kind == "platform" for r in rows)
    assert len(trials.runs) == 1 + TRIAL_RETRIES  # retried, as any platform failure


class KilledAfterFirst(CountingRuns):
    """The real trials; once the first has ended, the gateway they call back on is killed."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread) -> None:
        super().__init__()
        self.server, self.thread = server, thread

    async def __call__(self, req: TrialRequest) -> TrialOutcome:
        outcome = await super().__call__(req)
        if len(self.runs) == 1:
            self.server.should_exit = True
            await asyncio.to_thread(self.thread.join, 20)
        return outcome


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_the_gateway_killed_mid_job_fails_it_unscored(gym: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trials' gateway address goes down after the job's first trial: what was done is kept, the
    rest fails on the platform, and the job ends failed with no score — not a score of the trials
    that happened to run (why that address must be load-balanced in distributed mode)."""
    monkeypatch.setattr(evaluation_jobs, "RETRY_BACKOFF_S", (0.05, 0.05))
    port = closed_port()
    gym.listening_at(f"http://127.0.0.1:{port}")
    # lifespan off: only this listener dies (as a gateway replica would), not the gym behind it
    server = uvicorn.Server(uvicorn.Config(gym.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    killing = KilledAfterFirst(server, thread)
    runner, job_id, trials = evaluation(gym.gateway.store, tmp_path, f"http://127.0.0.1:{port}", tasks=3,
                                        attempts=1, trials=killing, concurrency=1)
    try:
        assert runner.execute(job_id)
    finally:
        runner.shutdown()
        server.should_exit = True
        thread.join(20)
    job, rows, score = finished(gym.gateway.store, job_id)
    assert not thread.is_alive()
    assert job.status == "failed" and job.score is None and score.score is None, (job.status, job.error)
    assert "platform failure" in (job.error or ""), job.error
    first, *rest = sorted(rows, key=lambda r: r.id)
    assert first.failure_kind is None and first.reward is not None  # the trial before the kill is kept
    assert rest and all(r.reward is None and r.failure_kind == "platform" for r in rest), rest
