"""Training jobs: persisted state, a worker pool, per-step metrics, cancel, logs, and resuming a job whose worker died."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, and_, or_, select, update
from sqlalchemy.orm import Session

from billing.ledger import Ledger, StepMeter
from billing.money import nusd_to_usd
from jobs.lifecycle import JobRunnerBase
from kit.config import BaseModel_, GymConfig
from kit.errors import NotFound
from kit.private_files import append_private, lock_down, private_dir
from kit.redact import redact
from services.models.loading import load_tokenizer, resolve_model_dir, torch_device
from services.models.training_text import tokenizer_markup
from services.records.events import TRAINING_JOB, EventLog
from services.training.backends import TRAINERS, TrainerSetup
from services.training.checkpoints import Checkpoint, CheckpointRegistry
from services.training.datasets import DatasetStore, UntrainableRow, training_pairs
from services.training.loss_sandbox import LossSandbox
from services.training.schemas import JobRequest
from services.training.tables import Dataset, TrainingJob, TrainingStep
from services.training.trainer import Resume, StepReport, Trainer, TrainingInputs, run_training, total_steps
from storage.store import Store
from storage.tables import LedgerEntry, utcnow

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


def _changed(result: Any) -> int:
    """Rows an UPDATE changed."""
    return int(cast(CursorResult[Any], result).rowcount)


def queue_for(base: BaseModel_) -> str:
    """Where a job's task goes: bases served by vLLM are GPU-sized models, trained on GPU nodes;
    local bases (CPU) and Tinker bases (the work happens at Tinker) on CPU workers."""
    return "training-gpu" if base.backend == "vllm" else "training"


class JobRunner(JobRunnerBase):
    """Training jobs on the common job lifecycle (jobs/lifecycle.py).

    A job whose worker died is queued again (at most ``RSIGYM_JOBS_MAX_RESUMES`` times, then it
    fails) and the worker that takes it continues from its last checkpoint (:meth:`_resume_point`):
    the checkpoint's weights and the trainer state saved with it (``state_dir``: optimiser,
    schedule, RNG; Tinker keeps its own), at the step after it. Billing, once per step: the
    dead worker's open hold is released by the reaper (the platform failed, the agent pays
    nothing for that step); the steps it had billed after the checkpoint are run again unmetered
    (their work was lost: the platform pays for it again, the agent paid once) and keep their row
    and their billed cost, written over with the metrics of the run the weights come from; the
    steps after them are billed as usual. The job's ``training.job`` event is written once, when
    it ends, with every checkpoint it wrote on any worker."""

    table = TrainingJob
    kind = "training"
    final = frozenset(FINAL)
    resumable = True

    def __init__(self, store: Store, config: GymConfig, datasets: DatasetStore, registry: CheckpointRegistry,
                 models_dir: Path, logs_dir: Path, hidden_paths: list[Path], tinker_client: Any = None,
                 events: EventLog | None = None, scratch_dir: Path | None = None, state_dir: Path | None = None):
        super().__init__(store, workers=config.training.workers, name="rsigym-train",
                         max_running_per_run=config.training.max_running_per_run)
        self.events = events
        self.config, self.datasets, self.registry = config, datasets, registry
        self.tinker_client = tinker_client
        self.models_dir, self.logs_dir, self.hidden_paths = models_dir, logs_dir, hidden_paths
        self.scratch_dir = scratch_dir
        """Custom-loss work dirs go here (RSIGYM_SCRATCH_DIR), apart from the data dir."""
        self.state_dir = state_dir or logs_dir.parent / "training-state"
        """The trainer state saved with each checkpoint, per job (``<job>/step-NNNNNN``), for a resume
        on another worker: the platform's, not charged to the run, removed when the job ends."""
        self.ledger = Ledger(store, config.ledger)

    def _log(self, job_id: str, line: str) -> None:
        private_dir(self.logs_dir)  # files at rest are the gym's alone (kit/private_files.py)
        append_private(self.logs_dir / f"{job_id}.log", f"{utcnow().isoformat(timespec='seconds')} {redact(line)}\n")

    def _after_final(self, job_id: str, status: str, error: str | None) -> None:
        self._log(job_id, f"finished: {status}" + (f" ({error})" if error else ""))
        shutil.rmtree(self.state_dir / job_id, ignore_errors=True)  # only a running job resumes

    # -- resuming --------------------------------------------------------------------------

    def _state_path(self, job_id: str, step: int) -> Path:
        return self.state_dir / job_id / f"step-{step:06d}"

    def _billed(self, job_id: str) -> list[int]:
        """What each step of the job billed so far, in step order: its ``train_step`` holds that
        were settled (an expired hold charged by the ledger's sweeper counts too: it was billed).
        A step's hold is taken after the previous step's was settled, and a released hold ends the
        job (or was the dead worker's, released by the reaper), so the n-th row is step n."""
        e = LedgerEntry
        with self.store.transaction() as s:
            return [int(n or 0) for n in s.scalars(
                select(e.actual_nusd).where(e.ref_id == job_id, e.service == "training", e.operation == "train_step",
                                            or_(e.status == "settled", and_(e.status == "expired", e.actual_nusd > 0)))
                .order_by(e.created_at, e.id))]

    def _resume_point(self, job: TrainingJob, billed: list[int]) -> tuple[Resume, str | None] | None:
        """Where a re-claimed job continues (None: a job that has not billed a step starts afresh):
        its newest checkpoint that has its trainer state saved — step 0 if none — and the steps
        billed after it (``billed``: :meth:`_billed`); with the checkpoint's id."""
        with self.store.transaction() as s:
            saved = s.execute(select(Checkpoint.id, Checkpoint.step, Checkpoint.path)
                              .where(Checkpoint.job_id == job.id).order_by(Checkpoint.step.desc())).all()
        for ckpt_id, step, path in saved:
            state = self._state_path(job.id, step)
            if state.is_dir() and step <= len(billed):
                return Resume(step, path, str(state), billed[step:]), ckpt_id
        return (Resume(0, None, None, billed), None) if billed else None

    def _save_state(self, trainer: Trainer, job_id: str, step: int) -> bool:
        """The trainer's state at this checkpoint, written whole (a temporary directory renamed);
        False when it could not be: the job goes on, and a resume uses an older checkpoint."""
        final = self._state_path(job_id, step)
        tmp = final.with_name(f".{final.name}.partial")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            private_dir(tmp.parent)  # files at rest are the gym's alone (kit/private_files.py)
            trainer.save_state(tmp)
            tmp.mkdir(parents=True, exist_ok=True)  # a trainer with nothing to save still marks the step
            lock_down(tmp)  # written under the process's umask
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            return True
        except Exception as err:  # noqa: BLE001 - only a resume needs it; the checkpoint itself is written
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("training job %s: the trainer state of step %d was not saved: %s", job_id, step, err)
            return False

    def _prune_states(self, job_id: str, keep: int) -> None:
        """Only the newest registered checkpoint's state is needed for a resume."""
        root = self.state_dir / job_id
        for old in root.glob("step-*") if root.is_dir() else ():
            if old.name != f"step-{keep:06d}":
                shutil.rmtree(old, ignore_errors=True)

    def _on_final(self, session: Session, job_id: str, status: str) -> None:
        """In the finishing transaction (a worker's, or the reaper's): the job's ``training.job``
        event, written once since a job reaches a final state once (a resumed job's too: re-queueing
        is not final), with the checkpoints it wrote on every worker and how often it was resumed."""
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
                                 "output_checkpoints": outputs, "steps": job.step, "cost_nusd": job.cost_nusd,
                                 "resumes": max(0, (job.claims or 0) - 1)})

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
        billed = self._billed(job_id)
        found = self._resume_point(job, billed)
        resume, from_checkpoint = found if found else (None, None)
        self._log(job_id, f"started on {torch_device()}: base {base.name}, {job.total_steps} steps")
        model_dir = resolve_model_dir(base, self.models_dir)
        try:  # rows that hold the base model's own tokens fail the job before its first step
            markup = tokenizer_markup(load_tokenizer(str(model_dir)))
            pairs = [p for d in datasets if d is not None
                     for p in training_pairs(self.datasets.blob_path(d.sha256), dataset_id=d.id, markup=markup)]
        except UntrainableRow as err:
            self._finish(job_id, "failed", str(err))
            return
        meter = StepMeter(self.ledger, job.key_id, "training", "train_step", ref_id=job_id, model=job.base_model)
        hashes = [d.sha256 for d in datasets if d is not None]
        cumulative = sum(billed[:resume.step]) if resume else 0
        announced = resume is None
        mine = (TrainingJob.id == job_id) & (TrainingJob.worker == self.worker_id) & (TrainingJob.status == "running")

        def on_step(report: StepReport) -> None:
            nonlocal cumulative, announced
            if not announced and resume is not None:
                announced = True
                replayed = len(resume.billed_nusd)
                self._log(job_id, f"resumed (taken {job.claims} times) from "
                          + (f"checkpoint {from_checkpoint} at step {resume.step}" if from_checkpoint
                             else "the job's input: no checkpoint had its state saved")
                          + f"; restored {trainer.restored()}"
                          + (f"; steps {resume.step + 1}-{resume.step + replayed} were billed before and are run "
                             "again unmetered" if replayed else ""))
            cumulative += report.cost_nusd
            with self.store.transaction() as s:
                # The job row first: it is locked until the commit, and a worker whose job was
                # reaped (it stalled; another worker resumed it) writes nothing more.
                progress = {} if report.replayed else {"step": report.step, "cost_nusd": cumulative}
                if not _changed(s.execute(update(TrainingJob).where(mine).values(heartbeat_at=utcnow(), **progress)
                                          .execution_options(synchronize_session=False))):
                    return
                row = s.get(TrainingStep, (job_id, report.step))
                if row is None:
                    s.add(TrainingStep(job_id=job_id, step=report.step, loss=report.loss, lr=report.lr,
                                       tokens=report.tokens, grad_norm=report.grad_norm, cost_nusd=report.cost_nusd,
                                       cumulative_cost_nusd=cumulative, loss_s=report.loss_s))
                else:  # a replayed step: the metrics of the run the weights come from, the cost it was billed
                    row.loss, row.lr, row.tokens, row.grad_norm, row.loss_s = (
                        report.loss, report.lr, report.tokens, report.grad_norm, report.loss_s)
                    row.cost_nusd, row.cumulative_cost_nusd = report.cost_nusd, cumulative
            if report.step % 10 == 0 or report.step == 1:
                self._log(job_id, f"step {report.step} loss {report.loss:.4f} lr {report.lr:.2e} tokens {report.tokens}"
                          + (" (replayed, not billed again)" if report.replayed else ""))

        def on_checkpoint(model: Any, step: int, metrics: dict[str, Any]) -> None:
            if not self._still_mine(job_id):  # reaped meanwhile: the job is another worker's now
                return
            saved = self._save_state(trainer, job_id, step)
            view = self.registry.save(model=model, run_id=job.run_id, job_id=job_id, base_model=base.name,
                                      parent=job.parent_checkpoint_id, dataset_hashes=hashes, config_hash=job.config_hash,
                                      loss_module_hash=job.loss_module_hash, step=step, metrics=metrics,
                                      experiment_id=job.experiment_id, events=self.events, key_id=job.key_id)
            if saved:
                self._prune_states(job_id, step)
            self._log(job_id, f"checkpoint {view['id']} at step {step}")

        def should_stop() -> bool:
            return self.should_stop(job_id)

        sandbox = (LossSandbox(request.custom_loss, self.config.training.custom_loss_timeout_s, self.hidden_paths,
                               uid_base=self.config.sandbox.uid_base, scratch_root=self.scratch_dir,
                               usd_per_hour=self.config.training.custom_loss_usd_per_hour)
                   if request.custom_loss else None)
        trainer = TRAINERS.get(base.backend)(TrainerSetup(base, device=torch_device(), tinker_client=self.tinker_client))
        inputs = TrainingInputs(model_dir=str(model_dir), parent_adapter=parent.path if parent else None, pairs=pairs,
                                request=request, steps=job.total_steps, loss_sandbox=sandbox, resume=resume)
        outcome = run_training(trainer, inputs, train_usd_per_mtok=base.train_usd_per_mtok, meter=meter,
                               on_step=on_step, on_checkpoint=on_checkpoint, should_stop=should_stop)
        if sum(billed) + meter.charged_nusd != cumulative:  # a failed step that was billed (a custom loss cut at its cap)
            with self.store.transaction() as s:
                s.execute(update(TrainingJob).where(mine).values(cost_nusd=sum(billed) + meter.charged_nusd))
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
