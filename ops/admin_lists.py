"""What every run made, across runs, for operators and auditors: datasets, training jobs,
checkpoints, evaluation jobs, sandboxes and submissions (``GET /admin/v1/<kind>``, ``rsigym list``).

Each list is read from the store through the owning service's read module (its ``Listing``),
newest first, filtered by run, key and status, and paged by an opaque cursor over (time, id) —
keyset paging, so a page is stable while rows are added and costs the same on page 1 and page
1000. Nothing here writes. The columns shown are chosen per kind: what an auditor needs to find a
row and open it with the run's own routes.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kit.errors import Unprocessable
from services.evaluation import read as evaluation
from services.sandbox import read as sandbox
from services.training import read as training
from storage.pages import Listing, ListQuery
from storage.store import Store

MAX_LIMIT = 500
DEFAULT_LIMIT = 50


@dataclass(frozen=True)
class ListKind:
    path: str
    """Its route under /admin/v1."""
    listing: Listing
    """Its columns and how to read a page (the owning service's read module)."""
    brief: tuple[str, ...] = ()
    """The columns ``rsigym list`` prints as a table (``--json`` has them all)."""


KINDS: dict[str, ListKind] = {
    "datasets": ListKind("/datasets", training.DATASETS,
                         brief=("id", "run_id", "name", "rows", "bytes", "created_at")),
    "training-jobs": ListKind("/training/jobs", training.TRAINING_JOBS,
                              brief=("id", "run_id", "status", "base_model", "step", "total_steps", "created_at")),
    "checkpoints": ListKind("/checkpoints", training.CHECKPOINTS,
                            brief=("id", "run_id", "job_id", "base_model", "step", "created_at")),
    "evaluation-jobs": ListKind("/evaluation/jobs", evaluation.EVALUATION_JOBS,
                                brief=("id", "run_id", "purpose", "status", "benchmark", "split", "model", "score", "created_at")),
    "sandboxes": ListKind("/sandboxes", sandbox.SANDBOXES,
                          brief=("id", "run_id", "template", "state", "seconds", "started_at")),
    "submissions": ListKind("/submissions", evaluation.SUBMISSIONS,
                            brief=("id", "run_id", "track", "model", "harness", "created_at")),
}


def _value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _cursor(row: dict[str, Any], listing: Listing) -> str:
    raw = f"{row[listing.time].isoformat()}|{row['id']}"
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
    listing = kind.listing
    if status is not None and not listing.statused:
        raise Unprocessable(f"{kind_name} have no status to filter by", param="status")
    if key_id is not None and not listing.keyed:
        raise Unprocessable(f"{kind_name} have no key to filter by; filter by run_id", param="key_id")
    after = None if cursor is None else _after(cursor)
    rows = listing.read(store, ListQuery(run_id, key_id, status, after, limit + 1))
    page = rows[:limit]
    data = [{name: _value(row[name]) for name in listing.columns} for row in page]
    following = _cursor(page[-1], listing) if len(rows) > limit else None
    return {"object": "list", "kind": kind_name, "data": data, "next_cursor": following}
