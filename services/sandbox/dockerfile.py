"""A task's ``environment/Dockerfile`` read as the ordered steps a template build runs.

There is no Docker here. The ``e2b`` package's own Dockerfile converter (the one E2B's template
builds use) walks the file and calls a builder back in file order; this builder records each call
as a :class:`Step`. ``FROM`` is not a step: the operator's base template stands in for it.
``ARG`` values are substituted by the converter. What no build here can do — another stage
(``COPY --from``), a download (``ADD https://…``) — is named in :attr:`Steps.refused`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from e2b.template import dockerfile_parser as _dockerfile_parser
from e2b.template.dockerfile_parser import DockerfileSyntaxError, parse_dockerfile

StepKind = Literal["run", "copy", "workdir", "env"]


@dataclass(frozen=True)
class Step:
    kind: StepKind
    command: str = ""
    """``run``: the shell command (``/bin/sh -c``)."""
    sources: tuple[str, ...] = ()
    """``copy``: paths or globs inside the build context (``environment/``)."""
    dest: str = ""
    """``copy``: absolute destination; ``workdir``: the directory."""
    mode: int | None = None
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class Steps:
    steps: list[Step] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    base_image: str = ""

    @property
    def runs(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "run"]


class _StepRecorder:
    """The callback interface of ``e2b.template.dockerfile_parser.parse_dockerfile``, in file order."""

    def __init__(self) -> None:
        self.out = Steps()
        self._workdir = "/"
        self._started = False
        self._own_workdir = False
        self._copy_open = False

    def run_cmd(self, command: Any, user: str | None = None) -> _StepRecorder:
        text = command if isinstance(command, str) else " && ".join(command)  # the converter's list: commands
        self.out.steps.append(Step("run", command=text))
        return self

    def copy(self, src: str, dest: str, force_upload: Any = None, user: str | None = None, mode: int | None = None,
             resolve_symlinks: Any = None, gzip: Any = None) -> _StepRecorder:
        if "://" in src:
            self.out.refused.append(f"ADD {src} (a download at build time)")
            return self
        dest_abs = dest if dest.startswith("/") else str(PurePosixPath(self._workdir) / dest) + (
            "/" if dest.endswith("/") else "")
        last = self.out.steps[-1] if self.out.steps else None
        if last is not None and last.kind == "copy" and last.dest == dest_abs and last.mode == mode \
                and self._copy_open:
            self.out.steps[-1] = Step("copy", sources=(*last.sources, src), dest=dest_abs, mode=mode)
        else:
            self.out.steps.append(Step("copy", sources=(src,), dest=dest_abs, mode=mode))
        self._copy_open = True  # one COPY with several sources arrives as several calls
        return self

    def set_workdir(self, workdir: str) -> _StepRecorder:
        # The converter sets Docker's default ("/") first and, when the file has no WORKDIR,
        # E2B's default ("/home/user") last; only a WORKDIR of the file itself counts.
        self._copy_open = False
        first, self._started = not self._started, True
        if first or (workdir == "/home/user" and not self._own_workdir):
            return self
        self._own_workdir = True
        self._workdir = workdir if workdir.startswith("/") else str(PurePosixPath(self._workdir) / workdir)
        self.out.steps.append(Step("workdir", dest=self._workdir))
        return self

    def set_user(self, user: str) -> _StepRecorder:
        self._copy_open = False  # a build runs every step as the image's root; trials as their own uid
        return self

    def set_envs(self, envs: dict[str, str]) -> _StepRecorder:
        self._copy_open = False
        self.out.steps.append(Step("env", env=tuple(envs.items())))
        return self

    def set_start_cmd(self, start_cmd: str, ready_cmd: Any) -> _StepRecorder:
        return self


def read_steps(text: str) -> Steps:
    """The build steps of a Dockerfile's text; ValueError names what is wrong with it."""
    recorder = _StepRecorder()
    try:
        recorder.out.base_image = parse_dockerfile(text, recorder)
    except DockerfileSyntaxError as exc:
        raise ValueError(f"Dockerfile: {exc}") from exc
    if any(line.strip().upper().startswith(("COPY --FROM", "ADD --FROM")) for line in text.splitlines()):
        recorder.out.refused.append("COPY --from (needs another build stage)")
    return recorder.out


def _quiet(*values: object, **_: Any) -> None:
    """The converter print()s its warnings; image_plan routes them to the log already."""


if getattr(_dockerfile_parser, "print", print) is print:
    _dockerfile_parser.print = _quiet  # type: ignore[attr-defined]
