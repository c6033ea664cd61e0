"""Training service logic: datasets, job submission, cancel, checkpoints."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select, update

from billing.storage_quota import StorageQuota
from kit.errors import NotFound, PermissionDenied, Unprocessable
from kit.identity import Identity
from kit.ids import new_id
from kit.spec import ServiceContext
from services.records.events import EventLog
from services.records.experiments import ExperimentRegistry
from services.records.live_integrity import LiveIntegrity
from services.training.checkpoints import CheckpointRegistry
from services.training.datasets import DatasetStore
from services.training.jobs import FINAL, JobRunner, job_view, queue_for
from services.training.schemas import NOT_CONFIG, JobRequest
from services.training.tables import Dataset, TrainingJob


def parse_job(body: dict[str, Any]) -> JobRequest:
    try:
        return JobRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise Unprocessable(f"{param or 'job'}: {first['msg']}", param=param) from err


class TrainingService:
    def __init__(self, context: ServiceContext):
        self.context = context
        config = context.config
        self.store = context.store
        self.events = EventLog(context.store, context.internal_secret)
        self.experiments = ExperimentRegistry(self.events)
        self.integrity = LiveIntegrity(context.store, config, context.data_dir, self.events)
        self.datasets = DatasetStore(context.store, context.data_dir / "datasets", config.training.max_dataset_bytes,
                                     config.training.max_dataset_rows, events=self.events,
                                     quota=StorageQuota.of(context), on_registered=self.integrity.dataset_registered)
        self.registry = CheckpointRegistry.of(context)
        tinker_client = None
        if any(m.backend == "tinker" for m in config.models):
            from services.models.tinker_client import service_client

            tinker_client = service_client(context.secrets)
        self.runner = JobRunner(context.store, config, self.datasets, self.registry,
                                context.settings.resolved_models_dir(), context.data_dir / "jobs",
                                hidden_paths=[context.data_dir], tinker_client=tinker_client, events=self.events,
                                scratch_dir=context.settings.resolved_scratch_dir())

    def submit(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        request = parse_job(body)
        run = identity.run_id
        base_name = request.base_model
        parent_id = request.parent_checkpoint
        parent_experiment = None
        if parent_id is not None:
            parent = self.registry.get(parent_id, run_id=run)
            base_name = parent.base_model
            # A checkpoint granted by --from is another run's: its experiment is not this run's to continue.
            # A job whose lora differs from the parent's adapter stacks a new one on it (backends/lora_stack.py).
            parent_experiment = parent.experiment_id if parent.run_id == run else None
        base = self.context.config.base_model(base_name) if base_name else None
        if base is None:
            raise NotFound(f"base model {base_name!r} is not offered by this gym", param="base_model")
        if base.backend == "tinker" and request.loss == "custom":
            raise Unprocessable("custom losses run only on locally trained base models", param="loss")
        rows = 0
        for dataset_id in request.datasets:
            rows += self.datasets.get(dataset_id, run_id=run).rows
        job = TrainingJob(
            id=new_id("ftjob"), run_id=run, key_id=identity.key_id, status="queued", base_model=base_name,
            parent_checkpoint_id=parent_id, dataset_ids=request.datasets,
            config=request.model_dump(mode="json", exclude=set(NOT_CONFIG)), config_hash=request.config_hash(),
            loss_module_hash=request.loss_module_hash(), total_steps=self.runner.total(request, rows),
            queue=queue_for(base),
        )
        with self.store.transaction() as s:  # the job and its experiment commit together, or neither
            job.experiment_id = self.experiments.resolve(
                s, run_id=run, key_id=identity.key_id, experiment_id=request.experiment,
                name=f"train {parent_id or base_name}", continues=[parent_experiment] if parent_experiment else [])
            s.add(job)
            s.flush()
            view = job_view(job)
        self.runner.submit(job.id)
        return view

    def cancel(self, identity: Identity, job_id: str) -> dict[str, Any]:
        with self.store.transaction() as s:
            job = s.get(TrainingJob, job_id)
            if job is None or job.run_id != identity.run_id:
                raise NotFound(f"training job {job_id} not found", param="id")
            status = job.status
            if status not in FINAL:
                s.execute(update(TrainingJob).where(TrainingJob.id == job_id).values(cancel_requested=True))
        if status == "queued":  # no worker has it: it ends now (a running one at its next step)
            self.runner.cancel_queued(job_id)
        return self.runner.get(job_id, identity.run_id)

    def end_run(self, identity: Identity, run_id: str) -> dict[str, int]:
        """Operator (the run's deadline passed): cancel every open job of the run the way
        :meth:`cancel` does — the worker stops at its next step and settles what it used."""
        if not identity.operator:
            raise PermissionDenied("operators only")
        with self.store.transaction() as s:
            ids = list(s.scalars(select(TrainingJob.id).where(TrainingJob.run_id == run_id,
                                                              TrainingJob.status.not_in(FINAL))))
            if ids:
                s.execute(update(TrainingJob).where(TrainingJob.id.in_(ids)).values(cancel_requested=True))
        self.runner.pump_quietly()  # its queued jobs end now, and other runs' jobs take the slots
        return {"jobs_cancelled": len(ids)}

    def shutdown(self) -> None:
        self.runner.shutdown()
        self.integrity.shutdown()

    def list_jobs(self, identity: Identity) -> list[dict[str, Any]]:
        with self.store.transaction() as s:
            rows = s.scalars(select(TrainingJob).where(TrainingJob.run_id == identity.run_id).order_by(TrainingJob.created_at))
            return [job_view(j) for j in rows]

    def dataset_content(self, identity: Identity, dataset_id: str) -> bytes:
        row: Dataset = self.datasets.get(dataset_id, run_id=None if identity.operator else identity.run_id)
        return self.datasets.blob_path(row.sha256).read_bytes()
