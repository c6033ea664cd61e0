"""The one checkpoint registry: opaque ids, owned by a run, with their provenance.

Training writes checkpoints; inference serves them, evaluation scores them, audits walk
their provenance chain (base model → parent checkpoint → datasets → config → loss module →
weights). All of them go through :class:`CheckpointRegistry` — no service queries another
service's tables. The rows are written by the platform only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, select
from sqlalchemy.orm import Mapped, mapped_column

from access.generations import granted_checkpoint
from billing.storage_quota import StorageQuota, tree_bytes
from kit.errors import NotFound
from kit.ids import new_id
from kit.private_files import lock_down, private_dir
from services.records.events import CHECKPOINT_REGISTERED, EventLog
from storage.store import Store
from storage.tables import Base, UTCDateTime, utcnow


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("training_jobs.id"), index=True)
    base_model: Mapped[str] = mapped_column(String(200))
    parent_checkpoint_id: Mapped[str | None] = mapped_column(String(40))
    dataset_hashes: Mapped[list[str]] = mapped_column(JSON)
    config_hash: Mapped[str] = mapped_column(String(64))
    loss_module_hash: Mapped[str | None] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    weights_hash: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(500))
    experiment_id: Mapped[str | None] = mapped_column(String(40), index=True)
    """The experiment whose training job wrote it (services/records/experiments.py)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


def checkpoint_view(c: Checkpoint) -> dict[str, Any]:
    return {
        "id": c.id, "object": "checkpoint", "job_id": c.job_id, "base_model": c.base_model,
        "parent_checkpoint": c.parent_checkpoint_id, "dataset_hashes": c.dataset_hashes, "config_hash": c.config_hash,
        "loss_module_hash": c.loss_module_hash, "step": c.step, "metrics": c.metrics, "weights_hash": c.weights_hash,
        "experiment": c.experiment_id, "created_at": c.created_at.isoformat(),
    }


def hash_dir(path: Path) -> str:
    """SHA-256 over every file's name and bytes, in name order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


class CheckpointRegistry:
    """Rows are returned detached (``expire_on_commit`` is off in the store's sessions), so
    callers read their fields after the transaction."""

    def __init__(self, store: Store, root: Path, quota: StorageQuota | None = None):
        self.store = store
        self.root = Path(root)
        self.quota = quota
        """The runs' storage meter: a saved checkpoint is charged with its row (None: readers only)."""

    @classmethod
    def of(cls, context: Any) -> CheckpointRegistry:
        """The gym's registry (a ``ServiceContext``: its store, ``<data dir>/checkpoints``, its
        ``[storage]`` quota)."""
        return cls(context.store, context.data_dir / "checkpoints", StorageQuota.of(context))

    def save(self, *, model: Any, run_id: str, job_id: str, base_model: str, parent: str | None,
             dataset_hashes: list[str], config_hash: str, loss_module_hash: str | None, step: int,
             metrics: dict[str, Any], experiment_id: str | None = None, events: EventLog | None = None,
             key_id: str | None = None) -> dict[str, Any]:
        """Write the adapter atomically (``model.save_pretrained``), then register it:
        servable from this moment. With ``events``, the row and its ``checkpoint.registered``
        event (for ``key_id``, the job's key) commit together."""
        ckpt_id = new_id("ckpt")
        private_dir(self.root)
        tmp = self.root / f".{ckpt_id}.partial"
        try:
            model.save_pretrained(tmp)
            lock_down(tmp)  # written under the process's umask: private before it is servable
            stored = tree_bytes(tmp)
            if self.quota is not None:  # refused before it is servable; the job fails with the reason
                self.quota.check_object("checkpoints", stored, param=None)
                self.quota.require(run_id, "checkpoints", stored, param=None)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        weights_hash = hash_dir(tmp)
        final = self.root / ckpt_id
        os.replace(tmp, final)
        try:
            with self.store.transaction() as s:
                if self.quota is not None:
                    self.quota.charge(s, run_id, "checkpoints", stored, param=None)
                row = Checkpoint(id=ckpt_id, run_id=run_id, job_id=job_id, base_model=base_model,
                                 parent_checkpoint_id=parent, dataset_hashes=dataset_hashes, config_hash=config_hash,
                                 loss_module_hash=loss_module_hash, step=step, metrics=metrics,
                                 weights_hash=weights_hash, path=str(final), experiment_id=experiment_id)
                s.add(row)
                s.flush()
                if events is not None:
                    events.append(s, run_id=run_id, kind=CHECKPOINT_REGISTERED, key_id=key_id,
                                  experiment_id=experiment_id,
                                  data={"checkpoint_id": ckpt_id, "job_id": job_id, "base_model": base_model,
                                        "parent_checkpoint": parent, "weights_hash": weights_hash,
                                        "dataset_hashes": dataset_hashes, "config_hash": config_hash, "step": step})
                return checkpoint_view(row)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise

    def get(self, ckpt_id: str, *, run_id: str | None) -> Checkpoint:
        """The checkpoint, if ``run_id`` owns it or was granted it as its initial checkpoint by
        ``--from`` (access/generations.py; ``None``: any run — platform reads only). The one place
        training's parent, inference's adapter and evaluation's model are resolved for a run."""
        with self.store.transaction() as s:
            row = s.get(Checkpoint, ckpt_id) if isinstance(ckpt_id, str) else None
            if row is None or (run_id is not None and row.run_id != run_id
                               and not granted_checkpoint(s, run_id, row.id)):
                raise NotFound(f"checkpoint {ckpt_id} not found", param="model")
            return row

    def experiment_of(self, ckpt_id: str, *, run_id: str) -> str | None:
        """The experiment that made the checkpoint, if it is ``run_id``'s own (404 unless the run may
        use it); None for the initial checkpoint ``--from`` granted: its experiment is the earlier run's."""
        row = self.get(ckpt_id, run_id=run_id)
        return row.experiment_id if row.run_id == run_id else None

    def usable(self, ckpt_id: str, run_id: str) -> Checkpoint | None:
        """:meth:`get` without the 404: the checkpoint if ``run_id`` may use it, else None."""
        try:
            return self.get(ckpt_id, run_id=run_id) if ckpt_id.startswith("ckpt_") else None
        except NotFound:
            return None

    def find(self, ckpt_id: str) -> Checkpoint | None:
        """Any run's checkpoint by id, or None; the caller decides who may use it."""
        if not ckpt_id.startswith("ckpt_"):
            return None
        with self.store.transaction() as s:
            return s.get(Checkpoint, ckpt_id)

    def rows(self, run_id: str) -> list[Checkpoint]:
        with self.store.transaction() as s:
            return list(s.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.created_at)))

    def ids_of_job(self, job_id: str) -> list[str]:
        with self.store.transaction() as s:
            return list(s.scalars(select(Checkpoint.id).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)))

    def list(self, run_id: str) -> list[dict[str, Any]]:
        return [checkpoint_view(c) for c in self.rows(run_id)]
