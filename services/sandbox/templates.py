"""Sandbox templates built from a task's Dockerfile: content-addressed, built once, reused.

``POST /sandbox/v2/templates`` (keys with the platform-granted ``build`` knob: the evaluation
service building a benchmark's tasks at registration) sends a base template's name, the
Dockerfile's text and its build context (the task's ``environment/`` as a tar.gz). The template's
id is a digest of what decides its content — the base template's settings, the Dockerfile, every
file of the context (path, type, mode, bytes) and the build format — so one Dockerfile on one
base is built once, whichever task or benchmark asks, and a changed file is another template.

A built template lives in the sandbox service's data directory (``sandbox-templates/<id>/``:
``manifest.json`` and the layer, services/sandbox/backends/local_build.py) and is named like a
configured one in a create's ``templateID``. Sandbox replicas that share a host share it; replicas
on several hosts need that directory shared (a volume).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kit.config import SandboxConfig, SandboxTemplate
from kit.errors import InvalidRequest, NotFound, Unprocessable
from kit.private_files import private_dir, write_private
from services.sandbox.dockerfile import read_steps

BUILD_FORMAT = "rsigym-build-1"
"""Part of every template id: a change to how builds run is a new id for every template."""
ID_PREFIX = "build-"
MAX_CONTEXT_BYTES = 64 * 1024 * 1024
MAX_DOCKERFILE_CHARS = 256 * 1024


class BuildRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base: str = Field(default="base", min_length=1, max_length=64)
    """The operator's template standing in for the Dockerfile's ``FROM``."""
    dockerfile: str = Field(min_length=1, max_length=MAX_DOCKERFILE_CHARS)
    context: str = Field(default="", max_length=MAX_CONTEXT_BYTES * 4 // 3 + 8)
    """The build context (``environment/``) as base64 of a tar.gz; empty: no context."""


def context_digest(root: Path) -> str:
    """A digest of a directory's files by relative path, type, mode and content (mtimes and owners
    do not count: two checkouts of one dataset build one template)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            h.update(f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{st.st_mode & 0o7777:o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def template_id(base: SandboxTemplate, dockerfile: str, context: Path) -> str:
    h = hashlib.sha256()
    for part in (BUILD_FORMAT, base.model_dump_json(), dockerfile, context_digest(context)):
        h.update(part.encode())
        h.update(b"\0")
    return ID_PREFIX + h.hexdigest()[:24]


def unpack_context(blob: str, dest: Path) -> None:
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("context is not base64", param="context") from None
    if len(raw) > MAX_CONTEXT_BYTES:
        raise Unprocessable(f"the build context is over {MAX_CONTEXT_BYTES >> 20} MiB", param="context")
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise InvalidRequest(f"context is not a readable tar.gz: {err}", param="context") from None


class BuiltTemplates:
    """The built templates of one sandbox host, by id."""

    def __init__(self, root: Path, config: SandboxConfig):
        self.root, self.config = root, config
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, name: str) -> SandboxTemplate | None:
        """The built template ``name`` (a configured one is the config's); None when absent."""
        if not name.startswith(ID_PREFIX) or "/" in name or name.startswith("."):
            return None
        manifest = self.root / name / "manifest.json"
        try:
            info = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        base = self.config.template(info["base"])
        if base is None:
            return None
        return base.model_copy(update={"name": name, "layer": str(self.root / name / "layer")})

    def listed(self) -> list[tuple[str, str, datetime]]:
        """``(id, base, built at)`` of every usable built template (its base still configured), oldest first."""
        out = []
        for manifest in self.root.glob(f"{ID_PREFIX}*/manifest.json") if self.root.is_dir() else ():
            tid = manifest.parent.name
            try:
                base, built_at = json.loads(manifest.read_text(encoding="utf-8"))["base"], manifest.stat().st_mtime
            except (OSError, ValueError, KeyError, TypeError):
                continue  # half-written or foreign: get() would not serve it either
            if self.config.template(base) is not None:
                out.append((tid, base, datetime.fromtimestamp(built_at, UTC)))
        return sorted(out, key=lambda t: (t[2], t[0]))

    def build(self, body: dict[str, Any], run_build: Any) -> dict[str, Any]:
        """Build (or find) the template; ``run_build(base, steps, context, out) -> log`` is the
        backend's builder. Raises Unprocessable naming what could not be built."""
        req = BuildRequest.model_validate(body)
        base = self.config.template(req.base)
        if base is None:
            names = ", ".join(t.name for t in self.config.templates)
            raise NotFound(f"base template {req.base!r} not found; templates: {names}", param="base")
        try:
            steps = read_steps(req.dockerfile)
        except ValueError as err:
            raise Unprocessable(str(err), param="dockerfile") from None
        if steps.refused:
            raise Unprocessable("cannot be built here: " + "; ".join(steps.refused), param="dockerfile")
        private_dir(self.root)
        with tempfile.TemporaryDirectory(prefix=".context-", dir=self.root) as tmp:
            context = Path(tmp) / "context"
            context.mkdir()
            if req.context:
                unpack_context(req.context, context)
            tid = template_id(base, req.dockerfile, context)
            with self._guard:
                lock = self._locks.setdefault(tid, threading.Lock())
            with lock:  # one build of one id at a time; the second asker finds it built
                if self.get(tid) is not None:
                    return self.view(tid, reused=True)
                target = self.root / tid
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir(mode=0o700)  # the gym's; sandboxes get a linked copy (backends/local.py)
                try:
                    log = run_build(base, steps, context, target / "layer", list(self.config.build_egress))
                    manifest = {"id": tid, "base": base.name, "format": BUILD_FORMAT,
                                "runs": [s.command[:500] for s in steps.runs], "log_tail": log[-2000:]}
                    write_private(target / "manifest.json", json.dumps(manifest))
                except BaseException:
                    shutil.rmtree(target, ignore_errors=True)
                    raise
        return self.view(tid, reused=False)

    def view(self, tid: str, *, reused: bool) -> dict[str, Any]:
        info = json.loads((self.root / tid / "manifest.json").read_text(encoding="utf-8"))
        return {"templateID": tid, "base": info["base"], "reused": reused, "runs": info["runs"],
                "buildLogTail": info.get("log_tail", "")}


def _stamp(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def listed_view(template: SandboxTemplate, *, base: str | None, created: datetime, envd_version: str) -> dict[str, Any]:
    """One template as E2B's ``GET /templates`` lists it (the SDK's ``Template`` model), with the
    gym's ``base`` (the configured template a built one stands on; null for a configured one) and
    ``usdPerHour``. ``createdAt``: a built template's build; a configured one's, the service's start
    (the config is read then)."""
    return {
        "templateID": template.name, "buildID": template.name, "aliases": [template.name], "names": [template.name],
        "cpuCount": template.cpu_count, "memoryMB": template.memory_mb, "diskSizeMB": template.disk_mb,
        "public": False, "createdAt": _stamp(created), "updatedAt": _stamp(created), "createdBy": None,
        "lastSpawnedAt": None, "spawnCount": 0, "buildCount": 1 if base else 0, "envdVersion": envd_version,
        "buildStatus": "ready", "base": base, "usdPerHour": template.usd_per_hour,
    }
