"""The checkpoint registry: opaque ids, owned by a run, with their provenance."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from sqlalchemy import select

from services.core.errors import NotFound
from services.core.ids import new_id
from services.core.store import Store
from services.training.tables import Checkpoint


def checkpoint_view(c: Checkpoint) -> dict[str, Any]:
    return {
        "id": c.id, "object": "checkpoint", "job_id": c.job_id, "base_model": c.base_model,
        "parent_checkpoint": c.parent_checkpoint_id, "dataset_hashes": c.dataset_hashes, "config_hash": c.config_hash,
        "loss_module_hash": c.loss_module_hash, "step": c.step, "metrics": c.metrics, "weights_hash": c.weights_hash,
        "created_at": c.created_at.isoformat(),
    }


def hash_dir(path: Path) -> str:
    """SHA-256 over every file's name and bytes, in name order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


class CheckpointRegistry:
    def __init__(self, store: Store, root: Path):
        self.store = store
        self.root = Path(root)

    def save(self, *, model: Any, run_id: str, job_id: str, base_model: str, parent: str | None,
             dataset_hashes: list[str], config_hash: str, loss_module_hash: str | None, step: int,
             metrics: dict[str, Any]) -> dict[str, Any]:
        """Write the adapter atomically, then register it: servable from this moment."""
        ckpt_id = new_id("ckpt")
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{ckpt_id}.partial"
        model.save_pretrained(tmp)
        weights_hash = hash_dir(tmp)
        final = self.root / ckpt_id
        os.replace(tmp, final)
        try:
            with self.store.transaction() as s:
                row = Checkpoint(id=ckpt_id, run_id=run_id, job_id=job_id, base_model=base_model,
                                 parent_checkpoint_id=parent, dataset_hashes=dataset_hashes, config_hash=config_hash,
                                 loss_module_hash=loss_module_hash, step=step, metrics=metrics,
                                 weights_hash=weights_hash, path=str(final))
                s.add(row)
                s.flush()
                return checkpoint_view(row)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise

    def get(self, ckpt_id: str, *, run_id: str | None) -> Checkpoint:
        with self.store.transaction() as s:
            row = s.get(Checkpoint, ckpt_id)
            if row is None or (run_id is not None and row.run_id != run_id):
                raise NotFound(f"checkpoint {ckpt_id} not found", param="model")
            return row

    def list(self, run_id: str) -> list[dict[str, Any]]:
        with self.store.transaction() as s:
            rows = s.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.created_at))
            return [checkpoint_view(c) for c in rows]
