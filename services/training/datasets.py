"""Dataset uploads: JSONL validated row by row, stored content-addressed and owned by a run.

Two row forms: chat (``{"messages": [...], "tools"?: [...]}``, the last message is the
assistant's answer) and completion (``{"prompt": "...", "completion": "..."}``). A file with any
bad row is refused whole, with line-numbered errors naming the field, and nothing is written.
A row is trained as services/models/training_text.py renders it, and a row that could write
structure of its own into that text — chat markup or special-token strings in any field, a tool
name outside ``^[A-Za-z0-9_-]{1,64}$`` — is a bad row. Identical content
is stored once (``<data>/datasets/<sha256>.jsonl``); a run that uploads it again gets its
existing dataset back. Each run's datasets count against its storage quota
(billing/storage_quota.py), charged in the transaction that records them.

A third kind, the loop row (``{"loop": {...}}``, services/models/training_text.py), is the
platform's record of what a Tinker loop trained on and sampled: :meth:`DatasetStore.record` stores
it the same way (content-addressed, a ``dataset.registered`` event) so the audit scans it like an
upload, but uploads refuse it and no job trains on it. A record is the platform's, so it is not
charged to the run's quota (an agent's loop must not fail for the audit's bookkeeping).

Every new dataset, upload or record, is scanned for contamination once it commits
(``on_registered``: services/records/live_integrity.py), in the background and for the operator
only: the upload's answer is the same, as fast, whatever the scan finds.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import select

from billing.storage_quota import StorageQuota
from kit.errors import NotFound, PayloadTooLarge, Unprocessable
from kit.ids import new_id
from kit.private_files import private_dir
from services.models.training_text import LOOP, is_loop_row, structure_problem, training_example
from services.records.events import DATASET_REGISTERED, EventLog
from services.training.tables import Dataset
from storage.store import Store

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_ERRORS = 20


def _check_chat(row: dict[str, Any]) -> str | None:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return f"messages[{i}] needs a role in {sorted(ROLES)}"
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            return f"messages[{i}].content must be a string"
        if m.get("tool_calls") is not None:
            if not isinstance(m["tool_calls"], list):
                return f"messages[{i}].tool_calls must be a list"
            for j, call in enumerate(m["tool_calls"]):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                        fn.get("arguments", ""), (str, dict)):
                    return (f"messages[{i}].tool_calls[{j}] must be a function call "
                            '({"function": {"name": str, "arguments": str | object}})')
    if messages[-1]["role"] != "assistant":
        return "the last message must be the assistant's answer"
    tools = row.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") for t in tools)):
        return "tools must be a list of function tools"
    extra = set(row) - {"messages", "tools"}
    return f"unknown fields {sorted(extra)}" if extra else structure_problem(row)


def _check_completion(row: dict[str, Any]) -> str | None:
    if not isinstance(row.get("prompt"), str) or not isinstance(row.get("completion"), str):
        return "prompt and completion must be strings"
    extra = set(row) - {"prompt", "completion"}
    return f"unknown fields {sorted(extra)}" if extra else structure_problem(row)


def validate_jsonl(raw: bytes, max_rows: int) -> tuple[str, int]:
    """Returns (format, rows) or raises 422 listing the bad lines."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Unprocessable(f"the dataset is not UTF-8 (byte {err.start})", param="body") from err
    errors: list[str] = []
    fmt: str | None = None
    rows = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        rows += 1
        if rows > max_rows:
            raise Unprocessable(f"more than {max_rows} rows", param="body")
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            errors.append(f"line {lineno}: not JSON ({err.msg})")
            continue
        if not isinstance(row, dict):
            errors.append(f"line {lineno}: a row must be a JSON object")
            continue
        if LOOP in row:
            errors.append(f"line {lineno}: {LOOP!r} rows are the platform's record of a Tinker loop; "
                          "uploads cannot write them")
            continue
        kind = "chat" if "messages" in row else "completion" if "prompt" in row else None
        if kind is None:
            errors.append(f"line {lineno}: a row needs messages, or prompt and completion")
            continue
        problem = _check_chat(row) if kind == "chat" else _check_completion(row)
        if problem is None and fmt is not None and kind != fmt:
            problem = f"mixes {kind} rows into a {fmt} dataset"
        if problem:
            errors.append(f"line {lineno}: {problem}")
        fmt = fmt or kind
        if len(errors) >= MAX_ERRORS:
            break
    if errors:
        raise Unprocessable("invalid dataset: " + "; ".join(errors), param="body")
    if rows == 0 or fmt is None:
        raise Unprocessable("the dataset has no rows", param="body")
    return fmt, rows


class UntrainableRow(ValueError):
    """A stored row the job's base model must not be trained on (its message names the dataset,
    line and field)."""


def training_pairs(path: Path, *, dataset_id: str = "", markup: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(prompt, answer) text pairs, each row rendered by services/models/training_text.py — the
    text the contamination audit reads. ``markup``: the base model's own special and added
    tokens; a row holding one (or the chat format's markup: a dataset stored before uploads
    refused it) raises :class:`UntrainableRow`."""
    pairs = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if is_loop_row(row):
                raise UntrainableRow(f"dataset {dataset_id or path.name} line {line_no}: a Tinker loop record "
                                     "(what a loop trained on, kept for the audit) is not training data")
            problem = structure_problem(row, markup)
            if problem is not None:
                raise UntrainableRow(f"dataset {dataset_id or path.name} line {line_no}: {problem}")
            pairs.append(training_example(row))
    return pairs


def dataset_view(d: Dataset) -> dict[str, Any]:
    return {"id": d.id, "object": "dataset", "name": d.name, "sha256": d.sha256, "format": d.format, "rows": d.rows,
            "bytes": d.bytes, "created_at": d.created_at.isoformat()}


class DatasetStore:
    def __init__(self, store: Store, root: Path, max_bytes: int, max_rows: int, events: EventLog | None = None,
                 quota: StorageQuota | None = None, on_registered: Callable[..., None] | None = None):
        self.store = store
        self.events = events
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.max_rows = max_rows
        self.quota = quota
        """The runs' storage meter (billing/storage_quota.py); None only for readers (audits)."""
        self.on_registered = on_registered
        """Called with ``run_id``, ``dataset_id`` and ``sha256`` after a new dataset commits: the live
        contamination scan (services/records/live_integrity.py), which returns at once and whose
        result the run never sees."""

    def blob_path(self, sha256: str) -> Path:
        return self.root / f"{sha256}.jsonl"

    def upload(self, *, run_id: str, key_id: str, raw: bytes, name: str | None) -> dict[str, Any]:
        """Validate, store and record a dataset for the run, charged to its storage quota with
        the row; a refusal (413 over the per-object limit, 403 ``quota_exceeded``) stores nothing."""
        if len(raw) > self.max_bytes:
            raise PayloadTooLarge(f"the dataset is {len(raw)} bytes; one dataset may hold at most {self.max_bytes}",
                                  param="body")
        if self.quota is not None:
            self.quota.check_object("datasets", len(raw), limit=self.max_bytes)
        fmt, rows = validate_jsonl(raw, self.max_rows)
        return self._register(run_id=run_id, key_id=key_id, raw=raw, name=name, fmt=fmt, rows=rows, charge=True)

    def record(self, *, run_id: str, key_id: str, raw: bytes, name: str, rows: int) -> dict[str, Any]:
        """Store and register loop rows the platform wrote (module docstring): as an upload is,
        without validation or the per-object limit, and not charged to the run's quota."""
        return self._register(run_id=run_id, key_id=key_id, raw=raw, name=name, fmt=LOOP, rows=rows, charge=False)

    def _register(self, *, run_id: str, key_id: str, raw: bytes, name: str | None, fmt: str, rows: int,
                  charge: bool) -> dict[str, Any]:
        quota = self.quota if charge else None
        digest = hashlib.sha256(raw).hexdigest()
        with self.store.transaction() as s:
            existing = s.scalar(select(Dataset).where(Dataset.run_id == run_id, Dataset.sha256 == digest))
            if existing is not None:  # the same content again: the same record, charged once
                return dataset_view(existing)
        if quota is not None:
            quota.require(run_id, "datasets", len(raw))
        created = self._write_blob(digest, raw)
        try:
            with self.store.transaction() as s:
                existing = s.scalar(select(Dataset).where(Dataset.run_id == run_id, Dataset.sha256 == digest))
                if existing is not None:
                    return dataset_view(existing)
                if quota is not None:
                    quota.charge(s, run_id, "datasets", len(raw))
                row = Dataset(id=new_id("ds"), run_id=run_id, key_id=key_id, name=name, sha256=digest, format=fmt,
                              rows=rows, bytes=len(raw))
                s.add(row)
                s.flush()
                if self.events is not None:  # a new dataset only: a re-upload is the same record
                    self.events.append(s, run_id=run_id, kind=DATASET_REGISTERED, key_id=key_id,
                                       data={"dataset_id": row.id, "sha256": digest, "rows": rows, "bytes": len(raw),
                                             "format": fmt, "name": name})
                view = dataset_view(row)
        except BaseException:
            if created:
                self._remove_unclaimed(digest)
            raise
        if self.on_registered is not None:  # committed: the live scan queued, its result never returned here
            self.on_registered(run_id=run_id, dataset_id=view["id"], sha256=digest)
        return view

    def _write_blob(self, digest: str, raw: bytes) -> bool:
        """Whether this call wrote the blob (False: the same content was already stored)."""
        target = self.blob_path(digest)
        if target.exists():
            return False
        private_dir(self.root)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".upload-")  # 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)  # atomic: never a half-written dataset under its hash
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return True

    def _remove_unclaimed(self, digest: str) -> None:
        """A refused upload's blob, unless some run's dataset row now holds the same content."""
        with self.store.transaction() as s:
            if s.scalar(select(Dataset.id).where(Dataset.sha256 == digest).limit(1)) is not None:
                return
        self.blob_path(digest).unlink(missing_ok=True)

    def get(self, dataset_id: str, *, run_id: str | None) -> Dataset:
        """``run_id`` None = operator access (audits)."""
        with self.store.transaction() as s:
            row = s.get(Dataset, dataset_id)
            if row is None or (run_id is not None and row.run_id != run_id):
                raise NotFound(f"dataset {dataset_id} not found", param="dataset")
            return row

    def list(self, run_id: str) -> list[dict[str, Any]]:
        with self.store.transaction() as s:
            return [dataset_view(d) for d in s.scalars(select(Dataset).where(Dataset.run_id == run_id).order_by(Dataset.created_at))]
