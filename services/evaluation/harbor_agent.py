"""A Harbor agent that runs a gym harness inside the trial's sandbox.

A harness is a directory with ``harness.toml`` at its root (see
``agent_container/harness/minimal``)::

    [harness]
    name = "minimal"
    install = "…"            # optional, run once in /harness
    run = "/usr/bin/python3 /harness/minimal_agent.py"

:class:`HarnessAgent` uploads the directory to ``/harness`` and runs ``install`` there
(``setup``); then writes the instruction to ``/task/instruction.md`` and runs ``run`` from the
task's working directory (``/app``) with the gym's harness contract in its environment
(``run``)::

    RSIGYM_TASK_INSTRUCTION_FILE=/task/instruction.md
    RSIGYM_TASK_METADATA=<the task's [metadata], JSON>
    OPENAI_BASE_URL=<the sandbox's model door, e.g. http://127.0.0.1:8700/inference/v1>
    OPENAI_API_KEY=door          # a placeholder: the door puts the real key on each request
    RSIGYM_MODEL=<model>   RSIGYM_SAMPLING=<JSON>
    RSIGYM_TRAJECTORY_FILE=/logs/agent/trajectory.json

The harness's ATIF trajectory is fetched into the trial's agent directory (where Harbor's
result and the gym's audits look for it) and its token totals go into the agent context.
A harness that exits non-zero is not a trial error: what it left behind is still verified,
and its exit code and output are kept beside the trajectory.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.agents.capabilities import AgentCapabilities
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.agent.context import AgentContext
from harbor.models.trajectories import Trajectory
from pydantic import ValidationError

from kit.errors import GymError
from services.evaluation.archives import MANIFEST_NAME, HarnessManifest, manifest_of

HARNESS_DIR = PurePosixPath("/harness")
TASK_DIR = PurePosixPath("/task")
INSTRUCTION_PATH = TASK_DIR / "instruction.md"
TRAJECTORY_PATH = PurePosixPath("/logs/agent/trajectory.json")
DEFAULT_WORKDIR = "/app"
DOOR_API_KEY = "door"
"""What the harness sends as its API key; the door replaces it with the trial's real key."""

TRAJECTORY_FILE = "trajectory.json"
INSTALL_LOG = "harness-install.txt"
RUN_STDOUT = "harness-stdout.txt"
RUN_STDERR = "harness-stderr.txt"
RUN_EXIT_CODE = "harness-exit-code.txt"


def read_manifest(harness_dir: Path) -> HarnessManifest:
    """The ``[harness]`` table of ``harness_dir/harness.toml``; ``ValueError`` when unusable."""
    try:
        return manifest_of(harness_dir)
    except GymError as exc:
        raise ValueError(f"{harness_dir / MANIFEST_NAME}: {exc.message}") from exc


def harness_digest(harness_dir: Path) -> str:
    """A content hash of the harness directory (paths and bytes), for the trial's records."""
    digest = hashlib.sha256()
    for path in sorted(p for p in harness_dir.rglob("*") if p.is_file()):
        digest.update(path.relative_to(harness_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


class HarnessAgent(BaseAgent):
    """Runs a gym harness (``harness.toml``) in the trial's environment; see the module docstring."""

    capabilities = AgentCapabilities(atif=True)

    def __init__(self, logs_dir: Path, model_name: str | None = None, *, harness_dir: str | Path,
                 sampling: dict[str, Any] | None = None, task_metadata: dict[str, Any] | None = None,
                 door_url: str | None = None, **kwargs: Any):
        self.harness_dir = Path(harness_dir)
        self.manifest = read_manifest(self.harness_dir)
        self.digest = harness_digest(self.harness_dir)
        self.sampling = dict(sampling or {})
        self.task_metadata = dict(task_metadata or {})
        self._door_url = door_url
        super().__init__(logs_dir=logs_dir, model_name=model_name, skip_model_parsing=True, **kwargs)

    @staticmethod
    def name() -> str:
        return "rsigym-harness"

    def version(self) -> str:
        return f"{self.manifest.name}@{self.digest[:12]}"

    async def setup(self, environment: BaseEnvironment) -> None:
        await environment.upload_dir(self.harness_dir, str(HARNESS_DIR))
        if self.manifest.install is None:
            return
        result = await environment.exec(self.manifest.install, cwd=str(HARNESS_DIR))
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / INSTALL_LOG).write_text(_transcript(result), encoding="utf-8")
        if result.return_code != 0:
            raise RuntimeError(f"harness install exited with code {result.return_code}: "
                               f"{_tail(result.stderr or result.stdout or '', 2000)}")

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        door_url = self._door_url or getattr(environment, "door_url", None)
        if not door_url:
            raise RuntimeError("the environment has no model door; a harness reaches its model only through one")
        if not self.model_name:
            raise RuntimeError("no model to run the harness against")
        workdir = getattr(environment, "workdir", None) or DEFAULT_WORKDIR

        prepared = await environment.exec(f"mkdir -p {TASK_DIR} {TRAJECTORY_PATH.parent}", cwd="/")
        if prepared.return_code != 0:
            raise RuntimeError(f"could not prepare {TASK_DIR}: {prepared.stderr or prepared.stdout}")
        with tempfile.TemporaryDirectory(prefix="rsigym-task-") as tmp:
            local = Path(tmp) / "instruction.md"
            local.write_text(instruction, encoding="utf-8")
            await environment.upload_file(local, str(INSTRUCTION_PATH))

        env = {
            "RSIGYM_TASK_INSTRUCTION_FILE": str(INSTRUCTION_PATH),
            "RSIGYM_TASK_METADATA": json.dumps(self.task_metadata),
            "OPENAI_BASE_URL": door_url,
            "OPENAI_API_KEY": DOOR_API_KEY,
            "RSIGYM_MODEL": self.model_name,
            "RSIGYM_SAMPLING": json.dumps(self.sampling),
            "RSIGYM_TRAJECTORY_FILE": str(TRAJECTORY_PATH),
            "RSIGYM_WORKDIR": workdir,
        }
        context.metadata = {"harness": self.manifest.name, "harness_sha256": self.digest}
        result = await environment.exec(self.manifest.run, cwd=workdir, env=env)
        self._keep_output(result)
        context.metadata.update(exit_code=result.return_code, summary=_summary_line(result.stdout))
        await self._fetch_trajectory(environment, context)

    def _keep_output(self, result: ExecResult) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / RUN_STDOUT).write_text(result.stdout or "", encoding="utf-8")
        (self.logs_dir / RUN_STDERR).write_text(result.stderr or "", encoding="utf-8")
        (self.logs_dir / RUN_EXIT_CODE).write_text(str(result.return_code), encoding="utf-8")

    async def _fetch_trajectory(self, environment: BaseEnvironment, context: AgentContext) -> None:
        target = self.logs_dir / TRAJECTORY_FILE
        try:
            await environment.download_file(str(TRAJECTORY_PATH), target)
        except Exception as exc:  # noqa: BLE001 - a harness that wrote none is recorded, not fatal
            self.logger.warning("the harness left no trajectory at %s: %s", TRAJECTORY_PATH, exc)
            context.metadata = {**(context.metadata or {}), "trajectory": "missing"}
            return
        try:
            trajectory = Trajectory.model_validate_json(target.read_bytes())
        except (ValidationError, ValueError) as exc:
            context.metadata = {**(context.metadata or {}), "trajectory": f"invalid: {str(exc)[:500]}"}
            return
        context.metadata = {**(context.metadata or {}), "trajectory": "valid"}
        totals = trajectory.final_metrics
        if totals is not None:
            context.n_input_tokens = totals.total_prompt_tokens
            context.n_output_tokens = totals.total_completion_tokens
            context.n_cache_tokens = totals.total_cached_tokens


def _summary_line(stdout: str | None) -> dict[str, Any] | None:
    """The harness's one-line JSON summary (its last stdout line), when it printed one."""
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


def _transcript(result: ExecResult) -> str:
    return f"exit code: {result.return_code}\n--- stdout\n{result.stdout or ''}\n--- stderr\n{result.stderr or ''}\n"


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


__all__ = ["HarnessAgent", "harness_digest", "read_manifest"]
