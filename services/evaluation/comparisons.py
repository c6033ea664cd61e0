"""What an agent sees of its own dev comparisons: a finished evaluation of a checkpoint compared
with the run's earlier finished evaluation of the checkpoint's parent (or, for a first-generation
checkpoint, its base model) — same benchmark, split, harness and task set — with the paired
bootstrap's 95% interval (services/evaluation/bootstrap.py).

Why here and on the agent's side: the seeds' agents kept or dropped checkpoints on single dev
numbers; ``within_noise`` tells the agent when a "gain" is one the data cannot tell from noise.
It is built only from the agent's own visible-split evaluations, so it tells the agent nothing it
could not compute from its own results.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.evaluation.bootstrap import paired_bootstrap, task_rewards
from services.evaluation.tables import EvaluationJob, TrialResultRow
from services.training.checkpoints import Checkpoint


def parent_model(s: Session, model: str, run_id: str) -> str | None:
    """The model a checkpoint of ``run_id`` was trained from; None for a base model (or another run's)."""
    ckpt = s.get(Checkpoint, model)
    if ckpt is None or ckpt.run_id != run_id:
        return None
    return ckpt.parent_checkpoint_id or ckpt.base_model


def _rewards(s: Session, job_id: str) -> dict[str, list[float]]:
    rows = s.execute(select(TrialResultRow.task_id, TrialResultRow.reward).where(TrialResultRow.job_id == job_id))
    return task_rewards((r.task_id, r.reward) for r in rows)


def dev_comparison(s: Session, job: EvaluationJob) -> dict[str, Any] | None:
    """``{vs_job, vs_model, diff, ci95, within_noise, …}`` for a succeeded agent evaluation of a
    checkpoint whose parent the run evaluated the same way before; None otherwise."""
    if job.purpose != "agent" or job.status != "succeeded":
        return None
    parent = parent_model(s, job.model, job.run_id)
    if parent is None:
        return None
    earlier = s.scalars(select(EvaluationJob).where(
        EvaluationJob.run_id == job.run_id, EvaluationJob.purpose == "agent", EvaluationJob.status == "succeeded",
        EvaluationJob.benchmark == job.benchmark, EvaluationJob.split == job.split, EvaluationJob.model == parent,
        EvaluationJob.harness == job.harness, EvaluationJob.id != job.id).order_by(EvaluationJob.created_at.desc()))
    vs = next((j for j in earlier if sorted(j.task_ids) == sorted(job.task_ids)), None)
    if vs is None:
        return None
    try:
        c = paired_bootstrap(_rewards(s, vs.id), _rewards(s, job.id))
    except ValueError:  # trials that do not pair (a resumed job still short of some): no interval
        return None
    return {"vs_job": vs.id, "vs_model": parent, "score": c.b, "vs_score": c.a, "diff": c.diff,
            "ci95": list(c.ci95), "within_noise": c.within_noise, "tasks": c.tasks,
            "method": c.to_json()["method"], "resamples": c.resamples, "seed": c.seed}
