"""An agent's finished dev evaluation of a checkpoint carries ``comparison`` against the run's
earlier evaluation of its parent on the same tasks (services/evaluation/comparisons.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from kit.ids import new_id
from kit.settings import StoreSettings
from services.evaluation.comparisons import dev_comparison
from services.evaluation.tables import EvaluationJob, TrialResultRow
from services.training.checkpoints import Checkpoint
from services.training.tables import TrainingJob
from storage.store import Store, sqlite_url

TASKS = [f"t{i}" for i in range(30)]


def _checkpoint(s: Any, run: str, ckpt: str, parent: str | None) -> None:
    job = new_id("trj")
    s.add(TrainingJob(id=job, run_id=run, key_id="k", base_model="tiny", dataset_ids=[], config={}, config_hash="c",
                      total_steps=1))
    s.flush()
    s.add(Checkpoint(id=ckpt, run_id=run, job_id=job, base_model="tiny", parent_checkpoint_id=parent,
                     dataset_hashes=[], config_hash="c", step=1, metrics={}, weights_hash="w", path="/x"))


def _evaluation(s: Any, run: str, model: str, rewards: dict[str, list[float]], *, tasks: list[str] = TASKS,
                status: str = "succeeded") -> EvaluationJob:
    job = EvaluationJob(id=new_id("evj"), run_id=run, key_id="k", purpose="agent", benchmark="arith", split="dev",
                        model=model, harness="minimal", attempts=2, sampling={}, task_ids=tasks, gateway_url="x",
                        status=status, trials_total=2 * len(tasks), trials_done=2 * len(tasks))
    s.add(job)
    for task, attempts in rewards.items():
        for n, reward in enumerate(attempts):
            s.add(TrialResultRow(job_id=job.id, task_id=task, attempt=n, reward=reward, trajectory=None))
    s.flush()
    return job


def test_a_checkpoint_is_compared_with_its_parent(store: Store) -> None:
    run = new_id("key")
    weak = {t: [0.0, 0.0] if i % 3 else [1.0, 0.0] for i, t in enumerate(TASKS)}
    strong = {t: [1.0, 1.0] for t in TASKS}
    with store.transaction() as s:
        _checkpoint(s, run, "ckpt_a", None)
        _checkpoint(s, run, "ckpt_b", "ckpt_a")
        base = _evaluation(s, run, "tiny", weak)
        first = _evaluation(s, run, "ckpt_a", weak)
        second = _evaluation(s, run, "ckpt_b", strong)
        other_tasks = _evaluation(s, run, "ckpt_b", {t: [1.0, 1.0] for t in TASKS[:10]}, tasks=TASKS[:10])

        assert dev_comparison(s, base) is None  # a base model has no parent
        same = dev_comparison(s, first)
        assert same is not None and same["vs_job"] == base.id and same["vs_model"] == "tiny"
        assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["within_noise"] is True
        gain = dev_comparison(s, second)
        assert gain is not None and gain["vs_job"] == first.id and gain["vs_model"] == "ckpt_a"
        assert gain["diff"] > 0 and gain["ci95"][0] > 0 and gain["within_noise"] is False and gain["tasks"] == 30
        assert dev_comparison(s, other_tasks) is None  # its parent never ran on these tasks
        assert dev_comparison(s, _evaluation(s, new_id("key"), "ckpt_b", strong)) is None  # another run's checkpoint


def test_the_agent_reads_it_on_its_job_and_in_its_record(make_gym: Any, tmp_path: Path) -> None:
    """What the agent reads: ``comparison`` on ``gym.evaluation.get`` and on the evaluation's
    event, written when the job finishes (the runner's final hook)."""
    from rsigym import Gym
    from services.records.events import EVALUATION_JOB
    from tests.conftest import create_key
    from tests.fakes.servers import serve_gym

    store = Store(sqlite_url(tmp_path / "db"), StoreSettings())
    store.migrate()
    gym = make_gym(store=store)
    with serve_gym(gym) as url:
        with httpx.Client(base_url=url) as c:
            key = create_key(c, track="joint", budget_usd=1.0)
        run = key["id"]
        with store.transaction() as s:
            _checkpoint(s, run, "ckpt_p", None)
            base = _evaluation(s, run, "tiny", {t: [0.0, 0.0] for t in TASKS})
            child = _evaluation(s, run, "ckpt_p", {t: [1.0, 1.0] for t in TASKS})
            base_id, child_id = base.id, child.id
        runner = gym.service_apps["evaluation"].state.evaluation.runner
        with store.transaction() as s:
            runner._on_final(s, child_id, "succeeded")
        with Gym(base_url=url, api_key=key["key"], max_retries=0) as agent:
            job = agent.evaluation.get(child_id)
            assert job.comparison is not None
            assert job.comparison["vs_job"] == base_id and job.comparison["within_noise"] is False
            assert job.comparison["diff"] == 1.0 and job.comparison["ci95"] == [1.0, 1.0]
            assert agent.evaluation.get(base_id).comparison is None
            (event,) = [e for e in agent.records.events(kind=EVALUATION_JOB) if e.data.get("job_id") == child_id]
            assert event.data["comparison"]["vs_model"] == "tiny" and event.data["comparison"]["tasks"] == 30
    store.dispose()
