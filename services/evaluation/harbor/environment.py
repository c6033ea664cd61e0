"""A Harbor environment backed by the gym's own sandbox service, reached through the gateway.

Harbor (``harbor.environments.base.BaseEnvironment``) runs a trial's agent and verifier in an
environment it starts, execs in, and copies files to and from. This one is a gym sandbox:

* **create** — a plain ``POST {gateway}/sandbox/v2/sandboxes`` with the trial's sandbox key
  and two gym extensions: ``rsigymDoor``, which opens the sandbox's only way out: a loopback
  port (``rsigymDoorUrl``) that leads to ``/inference/v1/*`` alone and puts the door key on
  every request (the door key goes to the sandbox service in that body and never into the
  sandbox; the sandbox sees only the URL); and ``rsigymDirs``, Harbor's log directories (mode
  777, what a Docker run bind-mounts) and the working directory, made inside the sandbox before
  the create answers, which names every directory it made. The keys come from
  :func:`~services.evaluation.harbor.trial_sandboxes.trial_sandboxes`. A judged task's verifier
  sandbox (never the agent's) gets a door of its own instead, to ``/rollout/v1/*`` with the judge
  key, and its commands see ``RSIGYM_JUDGE_URL`` / ``RSIGYM_JUDGE_MODEL`` (:func:`judge_env`);
  what that door was asked is read back before the sandbox is killed (:meth:`_collect_door_reports`).
* **drive** — the unmodified ``e2b`` SDK, its handle built from the create's answer as the SDK's
  own ``AsyncSandbox.create`` builds it (:mod:`~services.evaluation.harbor.sandbox_sdk`; the
  gateway is its API and daemon URL), as Harbor's own E2B environment does: ``commands.run`` for
  exec, the files API for transfers (directories as one listing plus per-file reads, and batched
  multipart writes — no tar needed in the image), ``kill`` on stop.
* **image** — there is no Docker here: the task's Dockerfile is replayed at start
  (:mod:`~services.evaluation.harbor.image_plan`), or, when it has ``RUN`` steps, was built into
  the template the trial is given (:mod:`~services.evaluation.templates`).
* **set-up** — what the environment does to the sandbox that nothing observes until a command
  runs or a file is read (directories an upload leaves empty or Harbor resets, the modes of
  uploaded executables) is deferred (:mod:`~services.evaluation.harbor.deferred_setup`).
* **known answers** — the environment keeps what it knows of the sandbox's files since the last
  process start (files it wrote, directories it found empty or the create made, whether any
  process ever ran) and skips what that answers: Harbor's resets of directories that are absent
  or empty (no look for one the create made or made a parent of, else a look by the files API —
  one listing of "/" for every directory whose first component is missing — the making
  deferred), the listing of such a directory when Harbor collects it, ``chmod +x`` of a file it
  has just written, ``rm -f`` of files in a directory it has just found empty where nothing has
  ever run, the second listing of a directory ``is_dir`` has just listed, and the second read of
  a file it has just read — or the write of the very bytes it has just read back (Harbor reads
  the oracle's log, downloads its directory, then uploads the log back). Anything it does not
  know runs as Harbor asked. Harbor's commands are recognised by their text, pinned to the
  Harbor release they were read from (:mod:`~services.evaluation.harbor.known_commands`).

What our sandboxes do not offer, and how it shows: one unprivileged uid per sandbox (Harbor's
``user=`` is accepted and ignored; the root filesystem is the sandbox's own and writable apart
from the read-only system directories, so ``/tests``, ``/logs``, ``/solution`` work as under
root); no PTY and no directory watches (unused here); **no network**: trials run with none,
whatever the task's ``network_mode`` says (``public`` is Harbor's default and Harbor does not
validate it), because the gym's rule is that a trial reaches the model through its door only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import posixpath
import shlex
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
from e2b import AsyncSandbox, CommandExitException, FileType
from e2b.exceptions import FileNotFoundException, SandboxException
from e2b.sandbox.filesystem.filesystem import WriteEntry
from harbor.environments.base import BaseEnvironment, EnvironmentPath, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import effective_exec_cwd, require_agent_environment_definition
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode
from harbor.utils.path_safety import validate_output_path
from pydantic import Field

from services.evaluation.harbor.deferred_setup import MKDIR, SETUP_FAILED, SetupStep, guarded_head
from services.evaluation.harbor.image_plan import ImagePlan, expand_sources, read_image_plan
from services.evaluation.harbor.known_commands import AGENT_SESSION_SUFFIX, chmod_x_path, rm_f_paths
from services.evaluation.harbor.sandbox_sdk import idempotent, read_bytes, sdk_sandbox
from services.evaluation.harbor.trial_sandboxes import JudgeDoor, TrialSandboxes, current_trial
from services.sandbox.schemas import MAX_DIRS, normal_dir_path
from services.sandbox.templates import ID_PREFIX as BUILT_PREFIX

ENVIRONMENT_TYPE = "rsigym-sandbox"
UPLOAD_BATCH_FILES = 200
UPLOAD_BATCH_BYTES = 8 * 1024 * 1024
LIST_DEPTH = 64
_BOOT_TIMEOUT_S = 60
_MKDIR_CALLS_BEFORE_A_READ = 2
"""Deferred directories made by as many files-API calls before a read, rather than a process start."""
REMEMBERED_READ_BYTES = 256 * 1024
"""Reads the environment keeps (see ``GymSandboxEnvironment._reads``): files this small or smaller, …"""
REMEMBERED_READS_TOTAL = 4 * 1024 * 1024
"""… up to this much in all; beyond it, reads are not kept."""


class GymSandboxOptions(EnvironmentOptions):
    """The environment's kwargs (``EnvironmentConfig.kwargs``); nothing secret."""

    gateway_url: str = Field(min_length=1, description="The gym's base URL, e.g. http://127.0.0.1:8700")
    template: str = Field(default="base", description="The sandbox template standing in for the task's image.")
    sandbox_timeout_sec: int = Field(default=3600, gt=0, description="The sandbox's lifetime; it dies after this.")
    door: bool = Field(default=True, description="Open the model door (the only way to the model).")
    metadata: dict[str, str] = Field(default_factory=dict, description="Extra sandbox metadata.")


def _inside(path: str, directory: str) -> bool:
    """``path`` names something strictly inside ``directory`` (lexically, ``..`` resolved)."""
    return posixpath.normpath(path).startswith(posixpath.normpath(directory).rstrip("/") + "/")


class GymSandboxEnvironment(BaseEnvironment):
    """A Harbor environment that is one gym sandbox (see the module docstring)."""

    options_model = GymSandboxOptions
    options: GymSandboxOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._plan = ImagePlan()
        self._sandbox: AsyncSandbox | None = None
        self._trial: TrialSandboxes | None = None
        self.sandbox_id: str | None = None
        self.door_url: str | None = None
        self._judged = False
        """Its sandbox has a judge door (a judged task's verifier)."""
        self._start_knowing_nothing()
        super().__init__(*args, **kwargs)
        self._gateway = self.options.gateway_url.rstrip("/")

    def _start_knowing_nothing(self) -> None:
        """What this environment knows of its sandbox's files (nothing yet), which lets it skip a
        call or a process start where the answer is known: set-up waiting to run, files it wrote,
        directories it found empty, and whether any process has run there."""
        self._setup: list[SetupStep] = []
        """Shell steps (mkdir -p, chmod) not yet run: they run at the head of the next command, or
        alone before anything reads the sandbox's files (see :meth:`_defer`)."""
        self._written: dict[str, int | None] = {}
        """Files this environment wrote since the last process start, with the mode it gave them
        (``None``: the daemon's default). Nothing but a process removes a file here, so until the
        next process start each of these is known to exist (see :meth:`_known_chmod_x`)."""
        self._known_empty_dirs: set[str] = set()
        """Directories :meth:`empty_dirs` found empty (or absent, and made; or made at the create)
        since the last process start, with nothing written or made inside them since (see
        :meth:`_known_rm_f`)."""
        self._made_listing: dict[str, set[str]] = {}
        """Directories the create made (absent before), each with the names in it (the others it
        made), while nothing else is known to be made or written inside it since the create."""
        self._known_dirs: dict[str, int | None] = {}
        """Directories known to exist since the last process start (made at the create), with
        their mode when known (``None``: not known). Only a process removes a directory or
        changes a mode here; a ``chmod`` deferred on one makes its mode unknown."""
        self._process_starts = 0
        self._changes = 0
        """Counts what this environment did that may change the sandbox's files (a process start, a
        write, a directory made): a listing taken at one count is only reused at the same count."""
        self._listing: tuple[str, int, list[Any]] | None = None
        """The last :meth:`is_dir` listing (path, change count, entries), for the
        :meth:`download_dir` of that path that follows it (Harbor's artifact collection)."""
        self._mutations = 0
        """Counts what this environment did that changed the sandbox's files already (a process
        start, a write, a directory made) — set-up deferred changes nothing until it runs."""
        self._top_names: tuple[int, frozenset[str]] | None = None
        """The names in "/" at a mutation count (see :meth:`_top_absent`)."""
        self._reads: dict[str, bytes] = {}
        self._reads_bytes = 0
        self._reads_at = 0
        """Small files read at change count ``_reads_at``, by path: read again at that count, the
        answer is these bytes, and writing these bytes there changes nothing (see :meth:`_read`).
        Like the listing above, this knows only what this environment did: a process left
        running in the sandbox may change a file at any moment, and an answer kept from a
        moment earlier is one its download could have got by running a moment earlier."""

    # -- identity and capabilities -------------------------------------------------------

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # No network at all (the door is not a network: it leads to inference only).
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)
        self._plan = read_image_plan(self.environment_dir)
        if self._plan.refused:
            raise SandboxBuildFailedError(
                "the gym's sandboxes cannot build this task's Dockerfile: it needs "
                + "; ".join(self._plan.refused)
                + ". Put the files under environment/ (copied at start or by a RUN step)."
            )
        if self._plan.runs and not self.options.template.startswith(BUILT_PREFIX):
            raise SandboxBuildFailedError(
                "this task's Dockerfile has RUN steps and no template was built from it; its benchmark's "
                "validation builds one (rsigym benchmarks register)")
        if self._plan.runs:
            self._plan.copies = []  # built into the template with every other step of the file
        # Dockerfile ENV sits under the task's and the trial's own variables.
        self._persistent_env: dict[str, str] = {**self._plan.env, **self._persistent_env}

    @property
    def is_agent_environment(self) -> bool:
        """The agent's sandbox, not the fresh one Harbor starts for the verifier (session
        ``<trial>__verifier__<key>``): only the agent's gets the model door."""
        return self.session_id == self.trial_paths.trial_dir.name + AGENT_SESSION_SUFFIX

    @property
    def workdir(self) -> str | None:
        return self.task_env_config.workdir or self._plan.workdir

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        trial = current_trial()
        if trial is None:
            raise RuntimeError("no sandbox credentials are bound; run the trial inside trial_sandboxes(...)")
        credentials = trial.credentials
        if self.network_policy.network_mode != NetworkMode.NO_NETWORK:
            self.logger.info("task asks for network_mode=%s; gym trials run without network (model door only)",
                             self.network_policy.network_mode.value)
        for note in self._plan.ignored:
            self.logger.info("Dockerfile: ignoring %s", note)

        # Harbor's log directories (what a Docker run would bind-mount, mode 777) and the working
        # directory, made by the sandbox service before its create answers (``rsigymDirs``): no
        # program starts for them in the first command. A path that is not normal goes the
        # deferred way (the shell makes sense of it, as it would have).
        logs = [str(d) for d in self._mount_targets(writable_only=True)]
        wanted: dict[str, int | None] = {d: 0o777 for d in logs}
        if self.workdir:
            wanted.setdefault(self.workdir, None)
        made_at_create = {d: mode for d, mode in wanted.items() if normal_dir_path(d)}
        if len(made_at_create) > MAX_DIRS:  # more than one create makes: all the deferred way
            made_at_create = {}

        self._trial = trial
        view = await self._create(trial, made_at_create)
        self.sandbox_id = view["sandboxID"]
        self.door_url = view.get("rsigymDoorUrl")
        self._sandbox = sdk_sandbox(view, api_key=credentials.sandbox_key, api_url=f"{self._gateway}/sandbox",
                                    sandbox_url=f"{self._gateway}/sandbox/envd")
        if not isinstance(view.get("rsigymDirsMade"), list):
            made_at_create = {}  # not made (a service that ignores the extension): the set-up makes them
        self._learn_made(made_at_create, [str(d) for d in view.get("rsigymDirsMade") or ()])
        rest = [d for d in wanted if d not in made_at_create]
        if rest:
            self._mkdirs(rest)
            if moded := [d for d in rest if wanted[d] is not None]:
                self._defer("command -p chmod 777", moded)
        await self._replay_copies()
        await self._upload_environment_dir_after_start()  # docker_image tasks without a Dockerfile

    async def _create(self, trial: TrialSandboxes, dirs: dict[str, int | None]) -> dict[str, Any]:
        metadata = {
            "harbor.session_id": self.session_id[:200],
            "harbor.trial_name": self.trial_paths.trial_dir.name[:200],
            "harbor.environment_name": self.environment_name[:200],
            **self.options.metadata,
        }
        if self.context_id is not None:
            metadata["harbor.context_id"] = str(self.context_id)
        body: dict[str, Any] = {"templateID": self.options.template, "timeout": self.options.sandbox_timeout_sec,
                                "metadata": metadata}
        judge = None if self.is_agent_environment else trial.credentials.judge
        if self.options.door and self.is_agent_environment:
            body["rsigymDoor"] = {"key": trial.credentials.door_key}
        elif judge is not None:  # a judged task's verifier: a door to its judge, never the agent's
            body["rsigymDoor"] = {"key": judge.key, "service": "rollout"}
        if dirs:
            body["rsigymDirs"] = [{"path": d, **({"mode": mode} if mode is not None else {})} for d, mode in dirs.items()]
        # The run's live-sandbox cap is shared with its own sandboxes and other jobs:
        # at the cap (429), wait for a slot rather than fail the trial.
        for wait in (0.5, 1, 2, 4, 8, 15, 30, 30, 30, 30, 60, 60, 60):
            trial.unanswered += 1  # until an answer says whether a sandbox exists
            response = await trial.client.post(f"{self._gateway}/sandbox/v2/sandboxes", json=body,
                                               headers=trial.headers)
            trial.unanswered -= 1
            if response.status_code == 201:
                trial.running.add(response.json()["sandboxID"])
            if response.status_code != 429:
                break
            await asyncio.sleep(wait)
        if response.status_code != 201:
            raise RuntimeError(f"the sandbox service refused to create a sandbox: HTTP {response.status_code}: "
                               f"{_error_message(response)}")
        view: dict[str, Any] = response.json()
        if judge is not None:
            self._judged = True
            self._persistent_env = {**self._persistent_env, **judge_env(view, judge)}
        return view

    async def _collect_door_reports(self, trial: TrialSandboxes) -> None:
        """What the sandbox's door kept, read in one look at the sandbox before it (and its door)
        goes: a judged verifier's judge calls (recorded with the reward), and the calls the agent's
        model door could not carry because the platform failed (the gateway unreachable, a
        502/503/504)."""
        judge = trial.credentials.judge if self._judged else None
        wants_failures = bool(self.door_url) and self.is_agent_environment
        if self.sandbox_id is None or (judge is None and not wants_failures):
            return
        view: dict[str, Any] = {}
        try:
            response = await trial.client.get(f"{self._gateway}/sandbox/sandboxes/{self.sandbox_id}",
                                              headers=trial.headers)
            if response.status_code == 200 and isinstance(body := response.json(), dict):
                view = body
        except (httpx.HTTPError, ValueError) as exc:
            self.logger.warning("the door reports of sandbox %s were not read: %s", self.sandbox_id, exc)
        if judge is not None:
            calls = view.get("rsigymJudgeCalls")
            trial.judge_calls = {"model": judge.model, **(calls if isinstance(calls, dict) else
                                                           {"calls": None, "prompts": [], "truncated": False})}
        failures = view.get("rsigymDoorFailures")
        if wants_failures and isinstance(failures, dict) and failures.get("count"):
            trial.door_failures = failures

    async def stop(self, delete: bool) -> None:
        """Kill the sandbox (sandboxes are ephemeral: ``delete=False`` changes nothing). Every
        process of the trial dies with it, the harness's included."""
        sandbox, self._sandbox = self._sandbox, None
        trial, self._trial = self._trial, None  # stopped once is stopped
        if self.sandbox_id is None or trial is None:
            return
        await self._collect_door_reports(trial)
        try:
            if sandbox is not None:
                await sandbox.kill()  # False when it was already gone: gone either way
            else:  # created, but the SDK never connected to it
                response = await trial.client.delete(f"{self._gateway}/sandbox/sandboxes/{self.sandbox_id}",
                                                     headers=trial.headers)
                if response.status_code not in (204, 404):
                    raise RuntimeError(f"HTTP {response.status_code}: {_error_message(response)}")
            trial.running.discard(self.sandbox_id)
        except Exception as exc:  # noqa: BLE001 - logged; the trial's sweep tries again
            self.logger.warning("could not kill sandbox %s: %s", self.sandbox_id, exc)

    # -- exec ----------------------------------------------------------------------------

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        """Run ``command`` with bash in the sandbox. A non-zero exit is a result, not an error;
        a timeout kills the command's process group and raises, as Harbor's Docker environment
        does. ``user`` is accepted and ignored (one uid per sandbox)."""
        if self._known_chmod_x(command) or self._known_rm_f(command):
            return ExecResult(stdout="", stderr="", return_code=0)
        cwd = effective_exec_cwd(cwd, self.workdir, None)
        if not self._setup:
            return await self._run_plain(command, cwd=cwd, env=self._merge_env(env), timeout_sec=timeout_sec)
        # The set-up not yet run goes first, in the same process start: each start is ~15-25 ms
        # of the trial. From "/", since the working directory may be one the set-up makes.
        return await self._with_setup((f"cd -- {shlex.quote(cwd)} || exit 1\n" if cwd else "") + command,
                                      cwd="/" if cwd else None, env=self._merge_env(env), timeout_sec=timeout_sec)

    def _learn_made(self, dirs: dict[str, int | None], made: list[str]) -> None:
        """What the create's answer tells: ``dirs`` (with their modes) exist, and ``made`` — every
        directory the create made, parents first — were absent, so each holds only the others."""
        self._known_dirs.update(dirs)
        for path in made:
            self._made_listing[path] = set()
            if (parent := posixpath.dirname(path)) in self._made_listing:
                self._made_listing[parent].add(posixpath.basename(path))
        self._known_empty_dirs.update(d for d, names in self._made_listing.items() if not names)

    def _defer(self, command: str, paths: list[str]) -> None:
        """Set-up that nothing observes until a command runs or a file is read — a directory to
        make, a mode to set — waits to run at the head of the next command (or alone, before a
        read: :meth:`_run_setup`). Each step is idempotent (``mkdir -p``, ``chmod``)."""
        self._setup.append(SetupStep(command, tuple(paths)))
        self._forget_empty(paths)
        if command != MKDIR:
            for path in paths:
                if path in self._known_dirs:
                    self._known_dirs[path] = None

    def _forget_empty(self, paths: Any) -> None:
        """Something is (or will be) made or written at ``paths``: the directories holding them are not empty."""
        self._changes += 1
        if self._known_empty_dirs:
            self._known_empty_dirs = {d for d in self._known_empty_dirs if not any(_inside(p, d) for p in paths)}
        if self._made_listing:
            self._made_listing = {d: names for d, names in self._made_listing.items()
                                  if not any(_inside(p, d) for p in paths)}

    def _mkdirs(self, dirs: list[str]) -> None:
        pending = {d for step in self._setup for d in (step.makes or ())}
        # ``mkdir -p`` twice is once, and of a directory known to exist is nothing
        dirs = [d for d in dict.fromkeys(dirs) if d not in pending and d not in self._known_dirs]
        if dirs:
            self._defer(MKDIR, dirs)

    def _known_chmod_x(self, command: str) -> bool:
        """``chmod +x FILE`` (Harbor's, before it runs a task's ``solve.sh`` or ``test.sh``) of a
        file this environment wrote since the last process start is set-up like an upload's
        modes: the file exists (only a process removes one), so the command cannot fail and prints
        nothing; it joins the deferred set-up (or is nothing at all when the mode the file was
        given already lets everyone execute it) and saves a process start (~10-15 ms). Any other
        command runs."""
        path = chmod_x_path(command)
        if path is None or path not in self._written:
            return False
        mode = self._written[path]
        if mode is None or mode & 0o111 != 0o111:
            self._defer("command -p chmod +x", [path])
            self._written[path] = None  # what +x leaves depends on the umask: unknown here
        return True

    def _known_rm_f(self, command: str) -> bool:
        """``rm -f -- FILE...`` (Harbor's, of the reward files before the verifier runs) where each
        file is inside a directory :meth:`empty_dirs` has just found empty, in a sandbox where no
        process has ever run: nothing but this environment has touched its files, so there is
        nothing to remove and the command is nothing at all. Any other command runs."""
        if self._process_starts or not self._known_empty_dirs:
            return False
        files = rm_f_paths(command) or []
        return bool(files) and all(
            f.startswith("/") and f == posixpath.normpath(f) and any(_inside(f, d) for d in self._known_empty_dirs)
            for f in files)

    async def ensure_dirs(self, dirs: Sequence[EnvironmentPath], *, chmod: bool = True) -> ExecResult | None:
        """Harbor's ``mkdir -p`` (and ``chmod 777``) of directories, deferred like the
        environment's own (nothing observes a directory before a command runs or a file is read;
        a step that fails there fails that call). Returns ``None``: nothing has run yet."""
        paths = [str(d) for d in dirs]
        if paths:
            self._mkdirs(paths)
            if chmod and (moded := [p for p in paths if self._known_dirs.get(p) != 0o777]):
                self._defer("command -p chmod 777", moded)
        return None

    async def empty_dirs(self, dirs: Sequence[EnvironmentPath], *, chmod: bool = True) -> ExecResult | None:
        """Harbor's reset of directories (each made, emptied, its mode 777), which Harbor runs
        before it uploads into them — three times in a trial's fresh verifier sandbox, where
        there is nothing to remove. A directory that does not exist, or exists (not as a link)
        and is empty, and that no pending step reaches inside, only needs making: deferred, as
        in :meth:`ensure_dirs`, after a look by the files API (~2-3 ms each, against a process
        start's ~15-25 ms). Anything else — something to remove, a link or a file in the way —
        runs Harbor's own command now, with the pending set-up at its head. Returns ``None``
        when nothing has run yet."""
        paths = [str(d) for d in dirs]
        if not paths:
            return None
        for path in paths:
            if not await self._known_empty(path):
                return await super().empty_dirs(dirs, chmod=chmod)
        await self.ensure_dirs(dirs, chmod=chmod)
        self._known_empty_dirs.update(paths)
        return None

    async def _known_empty(self, path: str) -> bool:
        """Whether ``path`` is absent, or an empty directory that is not a link — and stays so
        through the pending set-up (no pending step names anything inside it)."""
        if not path.startswith("/") or any(_inside(p, path) for step in self._setup for p in step.paths):
            return False
        if path in self._known_empty_dirs:
            return True
        parent, name = posixpath.split(posixpath.normpath(path))
        if name not in self._made_listing.get(parent, {name}):  # its directory was made at the create without it
            return True
        if await self._top_absent(path):
            return True
        sandbox = self._require()
        try:
            info = await idempotent(lambda: sandbox.files.get_info(path), path)
            if info.type != FileType.DIR or info.symlink_target is not None:
                return False
            return not await idempotent(lambda: sandbox.files.list(path, depth=1), path)
        except FileNotFoundException:
            return True
        except SandboxException:  # cannot look (a parent that is not a directory, no permission): not known
            return False

    async def _top_absent(self, path: str) -> bool:
        """Whether the first directory of ``path`` (absolute) is missing from "/" — then so is
        ``path``. One listing of "/" answers it for every path until the sandbox changes: Harbor's
        verifier resets ``/logs/verifier``, ``/logs/artifacts`` and ``/app`` in a fresh sandbox,
        one look each where one listing tells all three. A listing refused is no answer."""
        parts = PurePosixPath(posixpath.normpath(path)).parts
        if len(parts) < 2 or parts[0] != "/":
            return False
        if self._top_names is None or self._top_names[0] != self._mutations:
            mutations, sandbox = self._mutations, self._require()
            try:
                entries = await idempotent(lambda: sandbox.files.list("/", depth=1), "/")
            except SandboxException:
                return False
            names = (PurePosixPath(e.path).parts for e in entries)
            self._top_names = (mutations, frozenset(p[1] for p in names if len(p) > 1 and p[0] == "/"))
        return parts[1] not in self._top_names[1]

    async def _run_setup(self) -> None:
        """Run the deferred set-up now, alone (before the sandbox's files are read): a directory
        or two to make go by the files API (~3 ms a call), anything else in one process start
        (~8-12 ms in a trial)."""
        if not self._setup:
            return
        dirs = [d for step in self._setup for d in (step.makes or ())]
        if len(dirs) > _MKDIR_CALLS_BEFORE_A_READ or any(step.makes is None for step in self._setup):
            await self._with_setup("", cwd="/", timeout_sec=_BOOT_TIMEOUT_S)
            return
        sandbox = self._require()
        self._changes += 1
        self._mutations += 1
        for directory in dirs:  # on a failure every step stays deferred: making a directory twice is harmless
            try:
                await sandbox.files.make_dir(directory)
            except Exception as exc:  # noqa: BLE001 - e2b's errors for a file in the way and the like
                raise RuntimeError(f"could not create {directory}: {exc}") from exc
        self._setup = []

    async def _with_setup(self, script: str, *, cwd: str | None, env: dict[str, str] | None = None,
                          timeout_sec: float | None = None) -> ExecResult:
        """Run the deferred set-up, then ``script``, in one process. If a step fails the process
        exits :data:`SETUP_FAILED` with this call's mark on stderr (:func:`guarded_head`) before
        the script's own lines run, and this raises. Set-up that may not have run (the call
        failed or was cancelled) runs again with what comes next: every step is idempotent."""
        setup, self._setup = self._setup, []
        head, mark = guarded_head(setup)
        try:
            result = await self._run_plain(head + script, cwd=cwd, env=env, timeout_sec=timeout_sec)
        except BaseException:
            self._setup = setup + self._setup
            raise
        if result.return_code == SETUP_FAILED and mark in (result.stderr or ""):
            raise RuntimeError(f"could not prepare the sandbox: {result.stderr.replace(mark, '').strip()}")
        return result

    async def _run_plain(self, command: str, *, cwd: str | None, env: dict[str, str] | None = None,
                         timeout_sec: float | None = None) -> ExecResult:
        sandbox = self._require()
        self._process_starts += 1  # the command (and whatever it leaves running) may change any file:
        self._changes += 1
        self._mutations += 1
        self._written.clear()  # what this environment wrote may be gone,
        self._known_empty_dirs.clear()  # an empty directory filled,
        self._known_dirs.clear()  # a directory removed or its mode changed,
        self._made_listing.clear()  # a made directory filled
        callback = self._output_callback()
        handlers: dict[str, Any] = {}
        if callback is not None:
            handlers = {"on_stdout": lambda text: callback(text, "stdout"),
                        "on_stderr": lambda text: callback(text, "stderr")}
        handle = await sandbox.commands.run(command, background=True, cwd=cwd, envs=env or None, timeout=0,
                                            **handlers)
        try:
            result = await asyncio.wait_for(handle.wait(), timeout=timeout_sec or None)
        except CommandExitException as exc:
            result = exc
        except TimeoutError as exc:
            await _kill_quietly(handle)
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from exc
        except asyncio.CancelledError:
            # The trial gave up on this command (an agent timeout): it must not keep running
            # (and, say, write an answer) while the verifier looks.
            await asyncio.shield(_kill_quietly(handle))
            raise
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code)

    # -- files ---------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        data = source.read_bytes()
        if not self._holds(target_path, data):
            self._forget_empty([target_path])  # before: a write that fails may still have landed
            self._mutations += 1
            await self._require().files.write(target_path, data)
        self._written[target_path] = None
        mode = stat.S_IMODE(source.stat().st_mode)
        if mode & 0o111:
            self._chmod({mode: [target_path]})

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"Source directory {source_dir} does not exist")
        target = PurePosixPath(target_dir)
        files: list[tuple[str, Path]] = []
        empty_dirs: list[str] = [str(target)]
        for root, dirs, names in os.walk(source):
            rel_root = Path(root).relative_to(source)
            if not dirs and not names:
                empty_dirs.append(str(target / rel_root.as_posix()))
            files.extend((str(target / (rel_root / n).as_posix()), Path(root) / n) for n in sorted(names))
        await self._upload_many(files, empty_dirs)

    async def _upload_many(self, files: list[tuple[str, Path]], dirs: list[str]) -> None:
        self._require()  # no sandbox, no deferred set-up either
        # A write creates its file's parent directories: only the directories no file lands in
        # are made, with the next command or before the next read (an empty upload — Harbor's
        # log and artifact directories — is usually followed by a command).
        empty = sorted({d for d in dirs if not any(t.startswith(d.rstrip("/") + "/") for t, _ in files)})
        if empty:
            self._mkdirs(empty)
        batch: list[WriteEntry] = []
        size = 0
        modes: dict[int, list[str]] = {}
        for target, local in files:
            data = local.read_bytes()
            mode = stat.S_IMODE(local.stat().st_mode)
            if mode & 0o111:
                modes.setdefault(mode, []).append(target)
            if self._holds(target, data):
                self._written[target] = None  # as if written: it exists, its mode as the daemon left it
                continue
            if batch and (len(batch) >= UPLOAD_BATCH_FILES or size + len(data) > UPLOAD_BATCH_BYTES):
                await self._write_batch(batch)
                batch, size = [], 0
            batch.append({"path": target, "data": data})
            size += len(data)
        if batch:
            await self._write_batch(batch)
        if modes:
            self._chmod(modes)

    async def _write_batch(self, batch: list[WriteEntry]) -> None:
        self._forget_empty([entry["path"] for entry in batch])  # before: a write that fails may still have landed
        self._mutations += 1
        await self._require().files.write_files(batch)
        self._written.update((entry["path"], None) for entry in batch)

    async def _read(self, path: str, *, size: int | None = None) -> bytes:
        """A file's bytes: kept ones if this environment read it at the current change count (and,
        when the caller's listing gives a size, of that size), else read and, if small, kept."""
        kept = self._reads.get(path) if self._reads_at == self._changes else None
        if kept is not None and (size is None or size == len(kept)):
            return kept
        changes = self._changes
        data = bytes(await idempotent(functools.partial(read_bytes, self._require(), path), path))
        if self._reads_at != changes:
            self._reads, self._reads_bytes, self._reads_at = {}, 0, changes
        self._reads_bytes -= len(self._reads.pop(path, b""))  # a newer read replaces a kept one
        if len(data) <= REMEMBERED_READ_BYTES and self._reads_bytes + len(data) <= REMEMBERED_READS_TOTAL:
            self._reads[path] = data
            self._reads_bytes += len(data)
        return data

    def _holds(self, path: str, data: bytes) -> bool:
        """Whether the file at ``path`` is known to hold exactly ``data`` (read at the current
        change count): writing it there again would change nothing."""
        return self._reads_at == self._changes and self._reads.get(path) == data

    def _chmod(self, modes: dict[int, list[str]]) -> None:
        for mode, paths in modes.items():
            self._defer(f"command -p chmod {mode:o}", paths)
            for path in paths:
                if path in self._written:
                    self._written[path] = mode

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._run_setup()
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(await self._read(source_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a sandbox directory here: one recursive listing, then each file's bytes.
        Paths come from the sandbox, so each is checked to land inside ``target_dir``."""
        await self._run_setup()
        sandbox = self._require()
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        if posixpath.normpath(source_dir) in self._known_empty_dirs:
            return  # made empty (at the create, say) with nothing run or written there since: no listing
        root = PurePosixPath(source_dir)
        listing, self._listing = self._listing, None
        if listing is not None and listing[:2] == (source_dir, self._changes):
            entries = listing[2]  # is_dir just listed it, and nothing this side did since could change it
        else:
            entries = await idempotent(lambda: sandbox.files.list(str(root), depth=LIST_DEPTH), str(root))
        for entry in entries:
            rel = PurePosixPath(entry.path).relative_to(root)
            if not rel.parts or ".." in rel.parts:
                continue
            local = target.joinpath(*rel.parts)
            if entry.type == FileType.DIR:
                if entry.symlink_target is None:  # a link to a directory is not followed
                    local.mkdir(parents=True, exist_ok=True)
                    validate_output_path(local, target)
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            validate_output_path(local.parent, target)
            if local.is_symlink():
                local.unlink()
            try:
                local.write_bytes(await self._read(entry.path, size=entry.size))
            except FileNotFoundException:
                continue  # removed (or a dangling link) between the listing and the read

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        """Asked by Harbor before it downloads an artifact, which for a directory starts with its
        listing: the question is answered by taking that listing (one call where there were two).
        A listing refused for any reason but absence gets the plain answer (a file, a directory
        that cannot be read). A directory known to exist (made at the create, or made empty, with
        no process run since) needs no call at all."""
        await self._run_setup()
        normal = posixpath.normpath(path)
        if normal in self._known_dirs or normal in self._known_empty_dirs:
            return True
        sandbox = self._require()
        changes = self._changes
        try:
            entries = await idempotent(lambda: sandbox.files.list(path, depth=LIST_DEPTH), path)
        except FileNotFoundException:
            return False
        except SandboxException:
            return await self._path_type(path) == FileType.DIR
        self._listing = (path, changes, entries)
        return True

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        return await self._path_type(path) == FileType.FILE

    async def _path_type(self, path: str) -> FileType | None:
        await self._run_setup()
        try:
            return (await self._require().files.get_info(path)).type
        except FileNotFoundException:
            return None

    # -- helpers -------------------------------------------------------------------------

    async def _replay_copies(self) -> None:
        for copy in self._plan.copies:
            sources = [p for s in copy.sources for p in expand_sources(self.environment_dir, s)]
            into_dir = copy.dest.endswith("/") or len(sources) > 1 or await self._path_type(copy.dest) == FileType.DIR
            files: list[tuple[str, Path]] = []
            dirs: list[str] = [copy.dest.rstrip("/") or "/"] if into_dir else []
            for src in sources:
                if src.is_dir():
                    base = PurePosixPath(copy.dest)
                    for root, subdirs, names in os.walk(src):
                        rel_root = Path(root).relative_to(src).as_posix()
                        if not subdirs and not names:
                            dirs.append(str(base / rel_root))
                        files.extend((str(base / rel_root / n), Path(root) / n) for n in sorted(names))
                else:
                    files.append((str(PurePosixPath(copy.dest) / src.name) if into_dir else copy.dest, src))
            parents = sorted({str(PurePosixPath(t).parent) for t, _ in files} | set(dirs))
            await self._upload_many(files, parents)
            if copy.mode is not None and files:
                self._chmod({copy.mode: [t for t, _ in files]})

    def _require(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("Sandbox not found. Please start the environment first.")
        return self._sandbox


async def _kill_quietly(handle: Any) -> None:
    with contextlib.suppress(Exception):
        await handle.kill()


def judge_env(view: dict[str, Any], judge: JudgeDoor) -> dict[str, str]:
    """What a judged task's ``tests/test.sh`` sees of its judge: an OpenAI-compatible base URL
    (the door's, ``…/rollout/v1``), the model, and the most tokens the judge key allows."""
    env = {"RSIGYM_JUDGE_URL": str(view.get("rsigymDoorUrl") or ""), "RSIGYM_JUDGE_MODEL": judge.model}
    if judge.max_tokens is not None:
        env["RSIGYM_JUDGE_MAX_TOKENS"] = str(judge.max_tokens)
    return env


def _error_message(response: httpx.Response) -> str:
    try:
        err = response.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except ValueError:
        pass
    return response.text[:500]
