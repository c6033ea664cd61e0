"""Harnesses: the built-in ``minimal`` one and archives uploaded by runs.

An uploaded ``.tar.gz`` is checked and unpacked by services/evaluation/archives.py into a
fresh directory under the data dir, named by its SHA-256, and recorded for the run; the
archive bytes go to a temporary file first so a refused upload leaves nothing behind. The
archive and its unpacked tree count against the run's storage quota
(billing/storage_quota.py): the expanded size is admitted from the checked headers
before a byte is extracted.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import select

from access.generations import granted_harness
from billing.storage_quota import StorageQuota, tree_bytes
from kit.errors import Conflict, NotFound
from kit.ids import new_id
from kit.private_files import private_dir
from services.evaluation.archives import ArchiveLimits, build_archive, extract_archive, manifest_of
from services.evaluation.schemas import MINIMAL
from services.evaluation.tables import HarnessRow
from services.records.events import HARNESS_UPLOADED, EventLog
from storage.store import Store

MINIMAL_DIR = Path(__file__).resolve().parents[2] / "agent_container" / "harness" / "minimal"


def harness_view(row: HarnessRow) -> dict[str, Any]:
    return {"id": row.id, "object": "harness", "name": row.name, "sha256": row.sha256, "bytes": row.bytes,
            "files": row.files, "manifest": row.manifest, "created_at": row.created_at.isoformat()}


class HarnessStore:
    def __init__(self, store: Store, root: Path, limits: ArchiveLimits | None = None, events: EventLog | None = None,
                 quota: StorageQuota | None = None):
        self.store, self.root, self.limits = store, root, limits or ArchiveLimits()
        self.events = events
        self.quota = quota
        """The runs' storage meter; None only for readers (audits), which never upload."""
        private_dir(self.root)

    def upload(self, *, run_id: str, key_id: str, raw: bytes) -> dict[str, Any]:
        """Check, unpack and record an archive for the run, metered on its storage quota: the
        archive plus its unpacked tree, admitted from the headers before anything is extracted
        and charged with the row; a refusal leaves nothing of this upload on disk."""
        quota = self.quota
        if quota is not None:
            quota.check_object("harnesses", len(raw), limit=self.limits.max_compressed_bytes)
        digest = hashlib.sha256(raw).hexdigest()
        with self.store.transaction() as s:
            existing = s.scalar(select(HarnessRow).where(HarnessRow.run_id == run_id, HarnessRow.sha256 == digest))
            if existing is not None:
                return harness_view(existing)
        if quota is not None:
            quota.require(run_id, "harnesses", len(raw))

        def admit(expanded: int) -> None:
            if quota is not None:
                quota.check_object("harnesses", expanded, limit=self.limits.max_total_bytes)
                quota.require(run_id, "harnesses", len(raw) + expanded)

        dest, archive = self.root / digest, self.archive_path(digest)
        made: list[Path] = []
        try:
            if not dest.exists() or not archive.exists():
                fd, tmp = tempfile.mkstemp(prefix=".upload-", suffix=".tar.gz", dir=self.root)
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(raw)
                    if not dest.exists():
                        try:
                            extract_archive(tmp, dest, self.limits, admit=admit)
                            made.append(dest)
                        except Conflict:  # another upload of the same bytes won the race: same content
                            pass
                    if not archive.exists():
                        made.append(archive)
                    os.replace(tmp, archive)  # kept as uploaded: the provenance audit re-hashes it
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            files = sum(1 for p in dest.rglob("*") if p.is_file())
            size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            stored = tree_bytes(dest) + len(raw)
            if quota is not None:
                admit(stored - len(raw))  # a tree another run unpacked is charged to this run as well
            manifest = manifest_of(dest).model_dump(exclude_none=True)
            row = HarnessRow(id=new_id("hrn"), run_id=run_id, key_id=key_id, name=manifest["name"], sha256=digest,
                             bytes=size, files=files, manifest=manifest)
            with self.store.transaction() as s:
                if quota is not None:
                    quota.charge(s, run_id, "harnesses", stored)
                s.add(row)
                s.flush()
                if self.events is not None:
                    self.events.append(s, run_id=run_id, kind=HARNESS_UPLOADED, key_id=key_id,
                                       data={"harness_id": row.id, "sha256": digest, "bytes": size, "files": files,
                                             "stored_bytes": stored, "name": row.name})
        except BaseException:
            self._remove_unclaimed(digest, made)
            raise
        return harness_view(row)

    def _remove_unclaimed(self, digest: str, made: list[Path]) -> None:
        """What this upload put on disk, unless a harness row of another run now holds it."""
        if not made:
            return
        with self.store.transaction() as s:
            if s.scalar(select(HarnessRow.id).where(HarnessRow.sha256 == digest).limit(1)) is not None:
                return
        for path in made:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def archive_path(self, sha256: str) -> Path:
        """The uploaded archive, kept byte for byte beside its unpacked tree (audits re-hash and re-read it)."""
        return self.root / f"{sha256}.tar.gz"

    def list(self, run_id: str) -> list[dict[str, Any]]:
        with self.store.transaction() as s:
            rows = s.scalars(select(HarnessRow).where(HarnessRow.run_id == run_id).order_by(HarnessRow.created_at))
            return [harness_view(r) for r in rows]

    def directory(self, harness: str, *, run_id: str | None) -> Path:
        """The unpacked tree of ``minimal`` or of one of the run's harnesses, its initial harness
        granted by ``--from`` included (access/generations.py; None: any run)."""
        if harness == MINIMAL:
            return MINIMAL_DIR
        with self.store.transaction() as s:
            row = s.get(HarnessRow, harness)
            if row is None or (run_id is not None and row.run_id != run_id and not granted_harness(s, run_id, row.id)):
                raise NotFound(f"harness {harness!r} not found", param="harness")
            return self.root / row.sha256

    def owned(self, harness: str, run_id: str) -> None:
        self.directory(harness, run_id=run_id)


def build_minimal_archive(out_path: Path) -> Path:
    """The built-in harness as an archive: the starting point for an agent's own."""
    build_archive(MINIMAL_DIR, out_path)
    return out_path
