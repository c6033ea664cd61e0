"""What every run made, across runs, for operators and auditors: datasets, training jobs,
checkpoints, evaluation jobs, sandboxes and submissions (``GET /admin/v1/<kind>``, ``rsigym list``).

Each list is read straight from the store, newest first, filtered by run, key and status, and
paged by an opaque cursor over (time, id) — keyset paging, so a page is stable while rows are
added and costs the same on page 1 and page 1000. Nothing here writes. The columns shown are
chosen per kind: what an auditor needs to find a row and open it with the run's own routes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import InstrumentedAttribute

from kit.errors import Unprocessable
from services.evaluation.tables import EvaluationJob, SubmissionRow
from services.sandbox.tables import SandboxRow
from services.training.checkpoints import Checkpoint
from services.training.tables import Dataset, TrainingJob
from storage.store import Store

MAX_LIMIT = 500
DEFAULT_LIMIT = 50


@dataclass(frozen=True)
class ListKind:
    path: str
    """Its route under /admin/v1."""
    table: Any
    time: InstrumentedAttribute[Any]
    """The column the list is ordered by (newest first) and the cursor pages on."""
    columns: tuple[str, ...]
    status: InstrumentedAttribute[Any] | None = None
    brief: tuple[str, ...] = ()
    """The columns ``rsigym list`` prints as a table (``--json`` has them all)."""


KINDS: dict[str, ListKind] = {
    "datasets": ListKind("/datasets", Dataset, Dataset.created_at,
                         ("id", "run_id", "key_id", "name", "sha256", "format", "rows", "bytes", "created_at"),
                         brief=("id", "run_id", "name", "rows", "bytes", "created_at")),
    "training-jobs": ListKind("/training/jobs", TrainingJob, TrainingJob.created_at,
                              ("id", "run_id", "key_id", "status", "base_model", "parent_checkpoint_id", "dataset_ids",
                               "config_hash", "loss_module_hash", "experiment_id", "step", "total_steps", "cost_nusd",
                               "error", "created_at", "started_at", "finished_at"),
                              TrainingJob.status,
                              brief=("id", "run_id", "status", "base_model", "step", "total_steps", "created_at")),
    "checkpoints": ListKind("/checkpoints", Checkpoint, Checkpoint.created_at,
                            ("id", "run_id", "job_id", "base_model", "parent_checkpoint_id", "dataset_hashes",
                             "config_hash", "loss_module_hash", "step", "weights_hash", "experiment_id", "created_at"),
                            brief=("id", "run_id", "job_id", "base_model", "step", "created_at")),
    "evaluation-jobs": ListKind("/evaluation/jobs", EvaluationJob, EvaluationJob.created_at,
                                ("id", "run_id", "key_id", "purpose", "status", "benchmark", "split", "model", "harness",
                                 "attempts", "trials_done", "trials_total", "score", "experiment_id", "error",
                                 "created_at", "started_at", "finished_at"),
                                EvaluationJob.status,
                                brief=("id", "run_id", "purpose", "status", "benchmark", "split", "model", "score", "created_at")),
    "sandboxes": ListKind("/sandboxes", SandboxRow, SandboxRow.started_at,
                          ("id", "run_id", "key_id", "template", "backend", "internet", "state", "end_reason",
                           "seconds", "cost_nusd", "sandbox_metadata", "started_at", "ended_at"),
                          SandboxRow.state,
                          brief=("id", "run_id", "template", "state", "seconds", "started_at")),
    "submissions": ListKind("/submissions", SubmissionRow, SubmissionRow.created_at,
                            ("id", "run_id", "key_id", "track", "checkpoint_id", "model", "harness", "created_at"),
                            brief=("id", "run_id", "track", "model", "harness", "created_at")),
}


def _value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _cursor(row: Any, kind: ListKind) -> str:
    raw = f"{getattr(row, kind.time.key).isoformat()}|{row.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _after(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, row_id = raw.split("|", 1)
        return datetime.fromisoformat(when), row_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise Unprocessable("cursor is not one this list handed out; pass next_cursor as given",
                            param="cursor") from None


def list_rows(store: Store, kind_name: str, *, run_id: str | None = None, key_id: str | None = None,
              status: str | None = None, limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> dict[str, Any]:
    """One page of a kind's rows, newest first, and the cursor of the next page (None at the end)."""
    kind = KINDS.get(kind_name)
    if kind is None:
        raise Unprocessable(f"unknown list {kind_name!r}; expected one of {', '.join(KINDS)}", param="kind")
    if not 1 <= limit <= MAX_LIMIT:
        raise Unprocessable(f"limit must be 1..{MAX_LIMIT}, got {limit}", param="limit")
    if status is not None and kind.status is None:
        raise Unprocessable(f"{kind_name} have no status to filter by", param="status")
    table = kind.table
    if key_id is not None and not hasattr(table, "key_id"):
        raise Unprocessable(f"{kind_name} have no key to filter by; filter by run_id", param="key_id")
    query = select(table)
    if run_id is not None:
        query = query.where(table.run_id == run_id)
    if key_id is not None:
        query = query.where(table.key_id == key_id)
    if status is not None and kind.status is not None:
        query = query.where(kind.status == status)
    if cursor is not None:
        when, row_id = _after(cursor)
        query = query.where(or_(kind.time < when, and_(kind.time == when, table.id < row_id)))
    query = query.order_by(kind.time.desc(), table.id.desc()).limit(limit + 1)
    with store.transaction() as s:
        rows: Sequence[Any] = s.scalars(query).all()
        page = rows[:limit]
        data = [{name: _value(getattr(row, name)) for name in kind.columns} for row in page]
        following = _cursor(page[-1], kind) if len(rows) > limit else None
    return {"object": "list", "kind": kind_name, "data": data, "next_cursor": following}
