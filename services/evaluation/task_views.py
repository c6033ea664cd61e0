"""Harbor's view of a task directory, built once per content and reused by every trial of it.

Harbor rebuilds its view of a task on every trial, for a directory that does not change between
trials. Timed here (a bundled arithmetic task, 30 trials): ``Trial._load_task`` parses
``task.toml`` and walks the directory through its path-safety and ignore rules (~7 ms), the trial's
``lock.json`` hashes the directory's content (~8 ms) and ``result.json``'s ``task_checksum`` hashes
it again with ``dirhash`` (~4.5 ms): ~20 ms of the ~25 ms a trial spent before its first sandbox,
Python on the gym's event loop.

A :class:`TaskView` holds what those produce — the parsed ``Task``, Harbor's lock entry for it, the
checksum, the verifier mode the task declares — keyed by the directory's **content**: every
trial first hashes the directory's bytes (names, kinds, modes, file contents, link targets; one
pass, ~0.1 ms for a small task) and gets the view built from exactly those bytes, so a task edited
between trials (an operator regenerating a benchmark in place) gets a fresh view, never a stale
digest. Each trial gets its own copy of the ``Task`` (the trial mutates its config); the parts
Harbor only reads (paths, file filter) are shared. Only what Harbor computes is reused: the view is
built by Harbor's own functions, and a config that asks for anything the gym's trials never use
(extra instructions, skills, a user agent, a source trial, extra compose files) takes Harbor's own
path every time (:func:`trial_lock` returns None).
"""

from __future__ import annotations

import copy
import hashlib
import os
import stat
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harbor.models.job.lock import (
    TaskLock,
    TrialLock,
    VerifierLock,
    _build_lock_trial_task,
    _task_verifier_environment_mode,
)
from harbor.models.task.file_filter import TaskFileFilter
from harbor.models.task.paths import TaskPaths
from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import VerifierEnvironmentMode
from harbor.models.trial.config import TrialConfig
from harbor.tasks.client import TaskClient, TaskDownloadResult
from harbor.utils.file_selection import FileSelection

MAX_VIEWS = 256
"""Views kept (least recently used dropped): a benchmark's tasks and a few more."""


class _ViewPaths(TaskPaths):
    """Harbor's ``TaskPaths`` whose tree checks are answered once per view. A view is one content
    (its key), so the same check of the same tree gives the same answer: the verifier's
    ``resolve_verifier_environment_definition`` walks the tests and environment trees on every
    trial (~1 ms). Only checks that passed are remembered, and only with no exclusion rule or the
    task's own ``.harborignore`` rules; anything else is checked every time."""

    def __init__(self, task_dir: Path) -> None:
        super().__init__(task_dir)
        self._root = Path(self.task_dir).resolve()
        self._passed: set[tuple[Path, bool]] = set()

    def validate_input_tree(self, path: Path, *, exclude: Callable[[Path], bool] | None = None) -> None:
        owner = getattr(exclude, "__self__", None)
        known = exclude is None or (isinstance(owner, TaskFileFilter) and getattr(exclude, "__name__", "") ==
                                    "is_excluded" and owner.task_dir == self._root)
        key = (Path(os.path.abspath(path)), exclude is None)
        if known and key in self._passed:
            return
        super().validate_input_tree(path, exclude=exclude)
        if known:
            self._passed.add(key)


class _ViewFileFilter(TaskFileFilter):
    """Harbor's ``TaskFileFilter`` whose answers (is a path excluded, which files of a tree are
    selected) are kept for the view's life, for the same reason: the verifier selects the tests
    and checks test.sh on every trial (~1.4 ms). An answer that raised is not kept."""

    def __init__(self, task_dir: Path) -> None:
        super().__init__(task_dir)
        self._excluded: dict[Path, bool] = {}
        self._selections: dict[Path, FileSelection] = {}

    def is_excluded(self, path: Path) -> bool:
        key = Path(os.path.abspath(path))
        if key not in self._excluded:
            self._excluded[key] = super().is_excluded(path)
        return self._excluded[key]

    def select(self, source_dir: Path) -> FileSelection:
        key = Path(os.path.abspath(source_dir))
        if key not in self._selections:
            self._selections[key] = super().select(source_dir)
        return self._selections[key]


class ViewTask(Task):
    """Harbor's ``Task`` whose (deprecated) ``checksum`` — a ``dirhash`` of the directory, read
    once per trial by ``Trial._init_result`` — was computed when its view was built, and whose
    paths and file filter remember their answers (:class:`_ViewPaths`, :class:`_ViewFileFilter`).

    They remember from the start: ``Task.__init__`` makes Harbor's plain ones and checks the
    task's trees with them at once, and the setters below hand it the remembering kind instead,
    so the checks in ``__init__``, the verifier's and the checksum's ask each question once
    (building a view: ~9.5 → ~5.2 ms for the task and its checksum, timed in process)."""

    _view_checksum: str
    _view_paths: _ViewPaths
    _view_filter: _ViewFileFilter

    @property
    def paths(self) -> _ViewPaths:
        return self._view_paths

    @paths.setter
    def paths(self, value: TaskPaths) -> None:
        self._view_paths = value if isinstance(value, _ViewPaths) else _ViewPaths(value.task_dir)

    @property
    def file_filter(self) -> _ViewFileFilter:
        return self._view_filter

    @file_filter.setter
    def file_filter(self, value: TaskFileFilter) -> None:
        self._view_filter = value if isinstance(value, _ViewFileFilter) else _ViewFileFilter(value.task_dir)

    @property
    def checksum(self) -> str:
        return self._view_checksum


@dataclass(frozen=True, slots=True)
class TaskView:
    task: ViewTask
    """The template; :meth:`fresh_task` hands out copies."""
    download: TaskDownloadResult
    task_lock: TaskLock
    verifier_mode: VerifierEnvironmentMode | None

    def fresh_task(self) -> ViewTask:
        """A copy for one trial: its config (which the trial changes) and lists are its own."""
        task = copy.copy(self.task)
        task.config = self.task.config.model_copy(deep=True)
        task.extra_instruction_paths = list(self.task.extra_instruction_paths)
        task.extra_instructions = list(self.task.extra_instructions)
        return task


_views: OrderedDict[tuple[str, str], TaskView] = OrderedDict()
_lock = threading.Lock()


def content_digest(root: Path) -> str:
    """SHA-256 of a directory tree's names, kinds, modes, file bytes and link targets (links are
    not followed). Anything else in the tree (a socket, a device) counts by its name and kind."""
    h = hashlib.sha256()

    def visit(directory: str, rel: str) -> None:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            h.update(f"\0{name}\0{stat.S_IFMT(st.st_mode):o}\0{stat.S_IMODE(st.st_mode):o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(entry.path).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(entry.path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
            elif stat.S_ISDIR(st.st_mode):
                visit(entry.path, name)

    visit(str(root), "")
    return h.hexdigest()


def cacheable(config: TrialConfig) -> bool:
    """Whether the trial's config uses only what :func:`trial_lock` reproduces and the view's
    ``Task`` was built with (no extra instructions, skills, user agent, source trial, extra
    compose files, nor a disabled verifier); otherwise Harbor's own path runs."""
    return (config.task.path is not None and not config.task.is_git_task() and not config.task.is_package_task()
            and not config.extra_instruction_paths and not config.extra_instructions and not config.agent.skills
            and config.user_agent is None and config.source_trial is None and not config.verifier.disable
            and not config.environment.extra_docker_compose)


async def load(config: TrialConfig) -> tuple[ViewTask, TaskView]:
    """The trial's ``Task`` (a fresh copy) and its view; ``config`` must be :func:`cacheable`."""
    assert config.task.path is not None
    key = (config.task.model_dump_json(), content_digest(Path(config.task.path)))
    with _lock:
        view = _views.get(key)
        if view is not None:
            _views.move_to_end(key)
    if view is None:
        view = await _build(config)
        with _lock:
            _views[key] = view
            while len(_views) > MAX_VIEWS:
                _views.popitem(last=False)
    return view.fresh_task(), view


async def _build(config: TrialConfig) -> TaskView:
    """What ``Trial._load_task``, ``build_trial_lock`` and ``Task.checksum`` compute, by Harbor."""
    download = (await TaskClient().download_tasks(task_ids=[config.task.get_task_id()],
                                                  overwrite=config.task.overwrite,
                                                  output_dir=config.task.download_dir)).results[0]
    task = ViewTask(task_dir=download.path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        task._view_checksum = Task.checksum.fget(task)
    return TaskView(task=task, download=download, task_lock=_build_lock_trial_task(config.task, download),
                    verifier_mode=_task_verifier_environment_mode(download.path))


def trial_lock(config: TrialConfig, view: TaskView) -> TrialLock:
    """``harbor.models.job.lock.build_trial_lock`` for a :func:`cacheable` config, with the task's
    entry (its content digest) from the view. A test compares the two on the gym's trial configs."""
    return TrialLock(
        task=view.task_lock,
        install_only=config.install_only,
        override_error_policy=config.override_error_policy,
        timeout_multiplier=config.timeout_multiplier,
        agent_timeout_multiplier=config.agent_timeout_multiplier,
        verifier_timeout_multiplier=config.verifier_timeout_multiplier,
        agent_setup_timeout_multiplier=config.agent_setup_timeout_multiplier,
        environment_build_timeout_multiplier=config.environment_build_timeout_multiplier,
        agent=config.agent,
        environment=config.environment,
        verifier=VerifierLock(**dict(config.verifier), environment_mode=view.verifier_mode),
        artifacts=config.artifacts,
    )


def clear() -> None:
    """Forget every view (tests)."""
    with _lock:
        _views.clear()
