"""The image plan: what a trial's sandbox must look like at start, read from the task's Dockerfile.

There is no Docker here. The task's ``environment/Dockerfile`` is read with the ``e2b`` package's
own Dockerfile converter and *replayed*: the sandbox template stands in for ``FROM``;
``WORKDIR`` / ``COPY`` / ``ADD`` (local files) / ``ENV`` / ``ARG`` are applied at start (the
bundled benchmarks copy ``environment/app/`` into ``/app``). A file with ``RUN`` steps is built into
a template of its own when its benchmark is validated (services/evaluation/templates.py); what no
build here can do (``COPY --from``, a multi-stage file, a download) is refused before any sandbox
is created, rather than silently skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from e2b.template import dockerfile_parser as _dockerfile_parser
from e2b.template.dockerfile_parser import DockerfileSyntaxError, parse_dockerfile
from harbor.environments.base import SandboxBuildFailedError

log = logging.getLogger("rsigym.evaluation.harbor.image_plan")


@dataclass
class Copy:
    """One ``COPY`` / ``ADD``: its sources (in ``environment/``), where they go, the mode they get."""

    sources: list[str]
    dest: str
    mode: int | None


@dataclass
class ImagePlan:
    """What the sandbox must look like at start: the Dockerfile minus what the template is."""

    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    """``RUN`` steps: the task needs a template built from its Dockerfile (services/evaluation/templates.py),
    which has every step of the file in it; only ``ENV`` and ``WORKDIR`` are then applied at start."""


class _PlanBuilder:
    """The callback interface of ``e2b.template.dockerfile_parser.parse_dockerfile``."""

    _DEFAULT_USERS = ("root", "user")

    def __init__(self) -> None:
        self.plan = ImagePlan()
        self._workdir = "/"
        self._started = False
        self._pending: Copy | None = None

    def run_cmd(self, command: Any, user: str | None = None) -> _PlanBuilder:
        text = command if isinstance(command, str) else " ".join(command)
        self.plan.runs.append(text[:120])
        return self

    def copy(self, src: str, dest: str, force_upload: Any = None, user: str | None = None, mode: int | None = None,
             resolve_symlinks: Any = None, gzip: Any = None) -> _PlanBuilder:
        dest_abs = dest if dest.startswith("/") else str(PurePosixPath(self._workdir) / dest) + (
            "/" if dest.endswith("/") else "")
        last = self.plan.copies[-1] if self.plan.copies else None
        if last is not None and last is self._pending and last.dest == dest_abs and last.mode == mode:
            last.sources.append(src)  # one COPY with several sources arrives as several calls
        else:
            self._pending = Copy([src], dest_abs, mode)
            self.plan.copies.append(self._pending)
        return self

    def set_workdir(self, workdir: str) -> _PlanBuilder:
        # The converter sets Docker's default ("/") first and, when the file has no WORKDIR,
        # E2B's default ("/home/user") last; only a WORKDIR of the file itself counts.
        self._pending = None
        first, self._started = not self._started, True
        if first or (workdir == "/home/user" and self.plan.workdir is None):
            return self
        self._workdir = workdir if workdir.startswith("/") else str(PurePosixPath(self._workdir) / workdir)
        self.plan.workdir = self._workdir
        return self

    def set_user(self, user: str) -> _PlanBuilder:
        self._pending = None
        if user not in self._DEFAULT_USERS:
            self.plan.ignored.append(f"USER {user} (sandboxes run every command as their own uid)")
        return self

    def set_envs(self, envs: dict[str, str]) -> _PlanBuilder:
        self._pending = None
        self.plan.env.update(envs)
        return self

    def set_start_cmd(self, start_cmd: str, ready_cmd: Any) -> _PlanBuilder:
        self.plan.ignored.append("CMD/ENTRYPOINT (Harbor drives the sandbox by exec)")
        return self


def read_image_plan(environment_dir: Path) -> ImagePlan:
    """The replay plan of ``environment/Dockerfile`` (an empty plan when there is none)."""
    dockerfile = environment_dir / "Dockerfile"
    if not dockerfile.is_file():
        return ImagePlan()
    builder = _PlanBuilder()
    try:
        parse_dockerfile(dockerfile.read_text(encoding="utf-8"), builder)
    except (DockerfileSyntaxError, ValueError) as exc:
        raise SandboxBuildFailedError(f"{dockerfile}: {exc}") from exc
    text = dockerfile.read_text(encoding="utf-8")
    if any(line.strip().upper().startswith(("COPY --FROM", "ADD --FROM")) for line in text.splitlines()):
        builder.plan.refused.append("COPY --from (needs another build stage)")
    for copy in builder.plan.copies:
        for src in copy.sources:
            if "://" in src:
                builder.plan.refused.append(f"ADD {src} (downloads need network)")
    return builder.plan


def _converter_print(*values: object, **_: Any) -> None:
    text = " ".join(str(v) for v in values).strip()
    if text:
        log.debug("dockerfile: %s", text)


# The converter print()s its warnings. They used to be caught by redirecting sys.stdout around the
# parse — from a trial's worker thread, which swaps the whole process's stdout: anything printing
# meanwhile in another thread (an operator CLI in the same process) lost its output, or had its
# stream closed under it. Its own module's ``print`` goes to the log instead; nothing global moves.
_dockerfile_parser.print = _converter_print  # type: ignore[attr-defined]


def expand_sources(environment_dir: Path, pattern: str) -> list[Path]:
    """The local files and directories a ``COPY`` source (a path or a glob) names, each inside
    ``environment_dir``."""
    root = environment_dir.resolve()
    base = (root / pattern.lstrip("/")).resolve() if not any(c in pattern for c in "*?[") else None
    if base is not None:
        matches = [base] if base.exists() else []
    else:
        matches = sorted(p.resolve() for p in root.glob(pattern.lstrip("/")))
    for m in matches:
        if not m.is_relative_to(root):
            raise SandboxBuildFailedError(f"COPY source {pattern!r} is outside the environment directory")
    if not matches:
        raise SandboxBuildFailedError(f"COPY source {pattern!r} not found in {environment_dir}")
    return matches
