"""A run's unfinished jobs — training and evaluation rows still ``queued`` or ``running`` —
read straight from the store for ``GET /admin/v1/runs/{run_id}/jobs`` (``rsigym watch``).

The records API only sees a job once it finishes (its ``training.job`` / ``evaluation.job``
event), so the jobs in flight come from the job tables, through each service's read module.
Scoring jobs the operator started for the run (``purpose`` ``score``) carry the run's id too and
are listed with their purpose. Nothing here writes.
"""

from __future__ import annotations

from typing import Any

from kit.errors import NotFound
from services.evaluation import read as evaluation
from services.training import read as training
from storage.store import Store
from storage.tables import ApiKey


def running_jobs(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's queued and running jobs, oldest first; 404 for a child key or an unknown id."""
    with store.transaction() as s:
        key = s.get(ApiKey, run_id)
        if key is None or key.parent_id is not None:
            raise NotFound(f"run {run_id} not found", param="run_id")
        views = training.unfinished_jobs(s, run_id) + evaluation.unfinished_jobs(s, run_id)
    return sorted(views, key=lambda v: (v["created_at"], v["id"]))
