"""A benchmark's per-task sandbox templates: each task whose Dockerfile has ``RUN`` steps is built
into a template by the sandbox service at validation (``POST /sandbox/v2/templates``), and every
trial of that task — the harness's sandbox and the verifier's — starts from it.

Tasks whose Dockerfile only copies files and sets variables need no build: their files are
replayed at start (services/evaluation/harbor/image_plan.py) on the operator's base template.
The map ``task id → template id`` is kept in the registered copy (``.templates.json``); a build
that failed is kept there too, with its reason, which the benchmark's validation shows.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kit.private_files import write_private
from services.evaluation.benchmarks import TaskRef

log = logging.getLogger("rsigym.evaluation.templates")
TEMPLATES_FILE = ".templates.json"
BUILD_TIMEOUT = httpx.Timeout(connect=10.0, read=900.0, write=120.0, pool=60.0)
BASE_TEMPLATE = "base"


@dataclass
class TaskTemplates:
    built: dict[str, str] = field(default_factory=dict)
    """task id → built template id."""
    failed: dict[str, str] = field(default_factory=dict)
    """task id → why its Dockerfile could not be built."""

    def template_of(self, task_id: str) -> str:
        return self.built.get(task_id, BASE_TEMPLATE)


def needs_build(task: TaskRef) -> bool:
    """Whether the task's Dockerfile has a step only a build can do (``RUN``)."""
    dockerfile = task.path / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        return False
    from services.sandbox.dockerfile import read_steps  # the e2b converter: only for tasks that have one

    try:
        return bool(read_steps(dockerfile.read_text(encoding="utf-8")).runs)
    except ValueError:
        return True  # the build refuses it, with the parser's message, at registration


def _context_tar(environment: Path) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(environment.rglob("*")):
            tar.add(path, arcname=path.relative_to(environment).as_posix(), recursive=False)
    return base64.b64encode(buf.getvalue()).decode()


def build_templates(tasks: Iterable[TaskRef], gateway_url: str, key: str) -> TaskTemplates:
    """Build (or find built) every task's template that needs one; a failure is recorded, not raised."""
    out = TaskTemplates()
    with httpx.Client(timeout=BUILD_TIMEOUT) as client:
        for task in tasks:
            if not needs_build(task):
                continue
            environment = task.path / "environment"
            body = {"base": BASE_TEMPLATE, "dockerfile": (environment / "Dockerfile").read_text(encoding="utf-8"),
                    "context": _context_tar(environment)}
            try:
                response = client.post(f"{gateway_url.rstrip('/')}/sandbox/v2/templates", json=body,
                                       headers={"X-API-Key": key})
            except httpx.HTTPError as err:
                out.failed[task.id] = f"the sandbox service did not answer the build: {err}"
                continue
            if response.status_code == 200:
                out.built[task.id] = response.json()["templateID"]
            else:
                out.failed[task.id] = _message(response)
            log.info("task %s: template %s", task.id, out.built.get(task.id) or out.failed[task.id][:200])
    return out


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:500]}"


def save(bench_root: Path, templates: TaskTemplates) -> None:
    write_private(bench_root / TEMPLATES_FILE, json.dumps({"built": templates.built, "failed": templates.failed}))


def load(bench_root: Path) -> TaskTemplates:
    try:
        data = json.loads((bench_root / TEMPLATES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return TaskTemplates()
    return TaskTemplates(dict(data.get("built") or {}), dict(data.get("failed") or {}))
