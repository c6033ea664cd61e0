"""Training jobs: persisted state, a worker pool, per-step metrics, cancel and logs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from services.core.checkpoints import Checkpoint, CheckpointRegistry
from services.core.config import BaseModel_, GymConfig
from services.core.errors import NotFound
from services.core.events import TRAINING_JOB, EventLog
from services.core.jobs import JobRunnerBase
from services.core.ledger import Ledger, StepMeter
from services.core.money import nusd_to_usd
from services.core.redact import redact
from services.core.store import Store
from services.core.tables import utcnow
from services.models.loading import resolve_model_dir, torch_device
from services.training.backends import TRAINERS, TrainerSetup
from services.training.datasets import DatasetStore, training_pairs
from services.training.loss_sandbox import LossSandbox
from services.training.schemas import JobRequest
from services.training.tables import Dataset, TrainingJob, TrainingStep
from services.training.trainer import StepReport, TrainingInputs, run_training, total_steps

log = logging.getLogger("rsigym.training")
FINAL = {"succeeded", "failed", "cancelled", "budget_exhausted"}


def job_view(job: TrainingJob, steps: list[TrainingStep] | None = None, checkpoints: list[str] | None = None) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": job.id, "object": "training.job", "status": job.status, "base_model": job.base_model,
        "parent_checkpoint": job.parent_checkpoint_id, "datasets": job.dataset_ids, "config": job.config,
        "step": job.step, "total_steps": job.total_steps, "cost_usd": nusd_to_usd(job.cost_nusd), "error": job.error,
        "experiment": job.experiment_id, "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }
    if steps is not None:
        view["metrics"] = [{"step": s.step, "loss": s.loss, "lr": s.lr, "tokens": s.tokens, "grad_norm": s.grad_norm,
                            "cost_usd": nusd_to_usd(s.cost_nusd), "loss_s": s.loss_s,
                            "cumulative_cost_usd": nusd_to_usd(s.cumulative_cost_nusd)} for s in steps]
    if checkpoints is not None:
        view["checkpoints"] = checkpoints
    return view


def queue_for(base: BaseModel_) -> str:
    """Where a job's task goes: bases served by vLLM are GPU-sized models, trained on GPU nodes;
    local bases (CPU) and Tinker bases (the work happens at Tinker) on CPU workers."""
    return "training-gpu" if base.backend == "vllm" else "training"


class JobRunner(JobRunnerBase):
    """Training jobs on the common job lifecycle (services/core/jobs.py). A training job whose
    worker dies is failed, not resumed: its steps and checkpoints stay in the store, and the
    agent may start a new job from the last checkpoint."""

    table = TrainingJob
    kind = "training"
    final = frozenset(FINAL)

    def __init__(self, store: Store, config: GymConfig, datasets: DatasetStore, registry: CheckpointRegistry,
                 models_dir: Path, logs_dir: Path, hidden_paths: list[Path], tinker_client: Any = None,
                 events: EventLog | None = None, scratch_dir: Path | None = None):
        super().__init__(store, workers=config.training.workers, name="rsigym-train",
                         max_running_per_run=config.training.max_running_per_run)
        self.events = events
        self.config, self.datasets, self.registry = config, datasets, registry
        self.tinker_client = tinker_client
        self.models_dir, self.logs_dir, self.hidden_paths = models_dir, logs_dir, hidden_paths
        self.scratch_dir = scratch_dir
        """Custom-loss work dirs go here (RSIGYM_SCRATCH_DIR), apart from the data dir."""
        self.ledger = Ledger(store, config.ledger)

    def _log(self, job_id: str, line: str) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with open(self.logs_dir / f"{job_id}.log", "a", encoding="utf-8") as fh:
            fh.write(f"{utcnow().isoformat(timespec='seconds')} {redact(line)}\n")

    def _after_final(self, job_id: str, status: str, error: str | None) -> None:
        self._log(job_id, f"finished: {status}" + (f" ({error})" if error else ""))

    def _on_final(self, session: Session, job_id: str, status: str) -> None:
        """In the finishing transaction (a worker's, or the reaper's): the job's ``training.job``
        event, written once since a job reaches a final state once."""
        if self.events is None:
            return
        job = session.get(TrainingJob, job_id, populate_existing=True)
        if job is None:
            return
        datasets = [{"id": d.id, "sha256": d.sha256}
                    for d in session.scalars(select(Dataset).where(Dataset.id.in_(job.dataset_ids)))]
        order = {d: i for i, d in enumerate(job.dataset_ids)}
        datasets.sort(key=lambda d: order.get(d["id"], len(order)))
        outputs = list(session.scalars(select(Checkpoint.id).where(Checkpoint.job_id == job_id)
                                       .order_by(Checkpoint.step)))
        self.events.append(session, run_id=job.run_id, kind=TRAINING_JOB, key_id=job.key_id,
                           experiment_id=job.experiment_id,
                           data={"job_id": job.id, "status": status, "base_model": job.base_model,
                                 "input_checkpoint": job.parent_checkpoint_id, "config_hash": job.config_hash,
                                 "datasets": datasets, "loss_module_hash": job.loss_module_hash,
                                 "output_checkpoints": outputs, "steps": job.step, "cost_nusd": job.cost_nusd})

    def _run(self, job: TrainingJob) -> None:
        job_id = job.id
        with self.store.transaction() as s:
            datasets = [s.get(Dataset, d) for d in job.dataset_ids]
        parent = self.registry.get(job.parent_checkpoint_id, run_id=None) if job.parent_checkpoint_id else None
        request = JobRequest.model_validate({**job.config, "datasets": job.dataset_ids})
        base = self.config.base_model(job.base_model)
        if base is None:
            self._finish(job_id, "failed", f"base model {job.base_model} is no longer configured")
            return
        self._log(job_id, f"started on {torch_device()}: base {base.name}, {job.total_steps} steps")
        model_dir = resolve_model_dir(base, self.models_dir)
        pairs = [p for d in datasets if d is not None for p in training_pairs(self.datasets.blob_path(d.sha256))]
        meter = StepMeter(self.ledger, job.key_id, "training", "train_step", ref_id=job_id)
        hashes = [d.sha256 for d in datasets if d is not None]
        cumulative = 0

        def on_step(report: StepReport) -> None:
            nonlocal cumulative
            cumulative += report.cost_nusd
            with self.store.transaction() as s:
                s.add(TrainingStep(job_id=job_id, step=report.step, loss=report.loss, lr=report.lr, tokens=report.tokens,
                                   grad_norm=report.grad_norm, cost_nusd=report.cost_nusd, cumulative_cost_nusd=cumulative,
                                   loss_s=report.loss_s))
                s.execute(update(TrainingJob).where(TrainingJob.id == job_id).values(step=report.step, cost_nusd=cumulative))
            if report.step % 10 == 0 or report.step == 1:
                self._log(job_id, f"step {report.step} loss {report.loss:.4f} lr {report.lr:.2e} tokens {report.tokens}")

        def on_checkpoint(model: Any, step: int, metrics: dict[str, Any]) -> None:
            view = self.registry.save(model=model, run_id=job.run_id, job_id=job_id, base_model=base.name,
                                      parent=job.parent_checkpoint_id, dataset_hashes=hashes, config_hash=job.config_hash,
                                      loss_module_hash=job.loss_module_hash, step=step, metrics=metrics,
                                      experiment_id=job.experiment_id, events=self.events, key_id=job.key_id)
            self._log(job_id, f"checkpoint {view['id']} at step {step}")

        def should_stop() -> bool:
            return self.should_stop(job_id)

        sandbox = (LossSandbox(request.custom_loss, self.config.training.custom_loss_timeout_s, self.hidden_paths,
                               uid_base=self.config.sandbox.uid_base, scratch_root=self.scratch_dir,
                               usd_per_hour=self.config.training.custom_loss_usd_per_hour)
                   if request.custom_loss else None)
        trainer = TRAINERS.get(base.backend)(TrainerSetup(base, device=torch_device(), tinker_client=self.tinker_client))
        inputs = TrainingInputs(model_dir=str(model_dir), parent_adapter=parent.path if parent else None, pairs=pairs,
                                request=request, steps=job.total_steps, loss_sandbox=sandbox)
        outcome = run_training(trainer, inputs, train_usd_per_mtok=base.train_usd_per_mtok, meter=meter,
                               on_step=on_step, on_checkpoint=on_checkpoint, should_stop=should_stop)
        if meter.charged_nusd != cumulative:  # a failed step that was billed (a custom loss cut at its cap)
            with self.store.transaction() as s:
                s.execute(update(TrainingJob).where(TrainingJob.id == job_id).values(cost_nusd=meter.charged_nusd))
        self._finish(job_id, outcome.status, outcome.error)

    # -- reading ------------------------------------------------------------------------

    def get(self, job_id: str, run_id: str) -> dict[str, Any]:
        with self.store.transaction() as s:
            job = s.get(TrainingJob, job_id)
            if job is None or job.run_id != run_id:
                raise NotFound(f"training job {job_id} not found", param="id")
            steps = list(s.scalars(select(TrainingStep).where(TrainingStep.job_id == job_id).order_by(TrainingStep.step)))
            view = job_view(job, steps)
            view.update(self.queue_info(s, job))  # its place in the fair queue and how long it waited
        view["checkpoints"] = self.registry.ids_of_job(job_id)
        return view

    def logs(self, job_id: str, run_id: str) -> str:
        self.get(job_id, run_id)
        path = self.logs_dir / f"{job_id}.log"
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def total(self, request: JobRequest, rows: int) -> int:
        return total_steps(request, rows, self.config.training.max_steps)
