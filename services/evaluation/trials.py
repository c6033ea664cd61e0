"""One Harbor trial (a task × an attempt) on the gym's own sandbox service.

:func:`run_trial` is what the evaluation service calls. It builds Harbor's ``TrialConfig``
with the gym's environment (:class:`~services.evaluation.harbor.environment.GymSandboxEnvironment`,
by import path) and the agent the request names — the gym's
:class:`~services.evaluation.harbor_agent.HarnessAgent`, or Harbor's own ``oracle`` (the
task's solution) or ``nop`` (an empty answer) — runs Harbor's ``Trial`` and maps its
``TrialResult`` to a :class:`TrialOutcome`.

It never raises for a trial-level failure: a refused sandbox, a broken harness, a verifier
that wrote no reward all end up in ``TrialOutcome.error``, and whose failure it was in
``TrialOutcome.failure_kind`` (platform, verifier or agent: services/evaluation/failures.py).
And it always kills the trial's
sandbox: Harbor stops the environment itself, and afterwards a sandbox whose kill did not go
through is killed again and, when a create was cut short before its answer (it can leave a
sandbox Harbor never heard of), every sandbox the sandbox key still has running under this
trial's name (:meth:`~services.evaluation.harbor.trial_sandboxes.TrialSandboxes.sweep`).

The two keys are minted by the caller (the evaluation service) for this trial's job: the
sandbox key (sandbox only, with a model door) and the door key (inference of one model); for a
judged benchmark, a third, the judge key (rollout of the judge model, below the operator's key),
which only the verifier's sandbox gets a door with. What the verifier asked the judge is returned
in ``TrialOutcome.judge``.
Neither is written into Harbor's trial directory; they reach the environment through
:func:`~services.evaluation.harbor.trial_sandboxes.trial_sandboxes`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # Harbor imports litellm; stay offline

from harbor.models.job.lock import TrialLock  # noqa: E402
from harbor.models.task.verifier_mode import VerifierEnvironmentMode  # noqa: E402
from harbor.models.trial.config import (  # noqa: E402
    AgentConfig,
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
    VerifierConfig,
)
from harbor.models.trial.paths import TrialPaths  # noqa: E402
from harbor.models.trial.result import TrialResult  # noqa: E402
from harbor.trial.single_step import SingleStepTrial  # noqa: E402
from harbor.trial.trial import Trial, check_trial_config  # noqa: E402

from kit.private_files import lock_down, private_dir  # noqa: E402
from services.evaluation import task_views  # noqa: E402
from services.evaluation.benchmarks import TaskRef  # noqa: E402
from services.evaluation.failures import NO_REWARD, FailureKind, Phase, classify_failure  # noqa: E402
from services.evaluation.harbor.trial_sandboxes import (  # noqa: E402
    JudgeDoor,
    SandboxCredentials,
    trial_sandboxes,
)
from services.evaluation.harbor_agent import (  # noqa: E402
    INSTALL_LOG,
    RUN_EXIT_CODE,
    RUN_STDERR,
    RUN_STDOUT,
    TRAJECTORY_FILE,
)

log = logging.getLogger("rsigym.evaluation.trials")
ENVIRONMENT_IMPORT_PATH = "services.evaluation.harbor.environment:GymSandboxEnvironment"
HARNESS_AGENT_IMPORT_PATH = "services.evaluation.harbor_agent:HarnessAgent"
TRIAL_METADATA_KEY = "harbor.trial_name"
"""The sandbox metadata the environment stamps with the trial's name (used to find leftovers)."""
MAX_OUTPUT_CHARS = 64 * 1024
SANDBOX_MARGIN_S = 600
MAX_SANDBOX_TIMEOUT_S = 24 * 3600
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
AGENT_SETUP_TIMEOUT_S = 360.0

AgentKind = Literal["harness", "oracle", "nop"]


@dataclass
class TrialRequest:
    task: TaskRef
    harness_dir: Path | None
    gateway_url: str
    sandbox_key: str = field(repr=False)
    door_key: str = field(repr=False)
    model: str | None
    sampling: dict[str, Any]
    attempt: int
    trials_dir: Path
    template: str = "base"
    agent: AgentKind = "harness"
    agent_timeout_s: float | None = None
    verifier_timeout_s: float | None = None
    judge: JudgeDoor | None = None
    """A judged benchmark's judge (its key never enters Harbor's config)."""


@dataclass
class TrialOutcome:
    task_id: str
    attempt: int
    reward: float | None
    trajectory: dict[str, Any] | None
    verifier_output: str
    agent_output: str
    error: str | None
    sandbox_id: str | None
    started_at: str
    finished_at: str
    result_path: str | None
    failure_kind: FailureKind | None = None
    """Whose failure it was when ``error`` is set (services/evaluation/failures.py); None otherwise."""
    judge: dict[str, Any] | None = None
    """A judged trial's judge: its model and what the verifier asked it (services/sandbox/door.py)."""


async def run_trial(req: TrialRequest) -> TrialOutcome:
    """Run one trial; see the module docstring. Cancellation propagates (after cleanup)."""
    started_at = _now()
    trial_name = f"{_safe(req.task.id)}__a{req.attempt}__{secrets.token_hex(4)}"
    try:
        config = build_trial_config(req, trial_name)
    except (ValueError, TypeError) as exc:  # the gym could not configure it: nothing the harness did
        return _outcome(req, started_at, error=f"{type(exc).__name__}: {exc}", kind="platform")

    private_dir(req.trials_dir)  # Harbor writes the trial's files under the process's umask: closed around them
    trial: Trial | None = None
    result: TrialResult | None = None
    error: str | None = None
    kind: FailureKind | None = None
    sandbox_id: str | None = None
    judge: dict[str, Any] | None = None
    door_failures: dict[str, Any] | None = None
    async with trial_sandboxes(SandboxCredentials(req.sandbox_key, req.door_key, req.judge),
                               req.gateway_url) as sandboxes:
        try:
            trial = await create_trial(config)
            result = await trial.run()
        except Exception as exc:  # noqa: BLE001 - a trial-level failure is recorded, never raised
            error = f"{type(exc).__name__}: {exc}"
            # Harbor's run records what the harness's phases raise: what escapes is outside them
            kind = classify_failure(type(exc).__name__, str(exc), "prepare")
        finally:
            if trial is not None:
                sandbox_id = getattr(trial.agent_environment, "sandbox_id", None)
            await asyncio.shield(sandboxes.sweep({TRIAL_METADATA_KEY: trial_name}))
            judge = sandboxes.judge_calls
            door_failures = sandboxes.door_failures
            if judge is None and req.judge is not None:  # the verifier never got its sandbox
                judge = {"model": req.judge.model, "calls": 0, "prompts": [], "truncated": False}

    paths = TrialPaths(trial_dir=req.trials_dir / trial_name)
    lock_down(paths.trial_dir)  # what Harbor wrote, made the gym's alone (kit/private_files.py)
    if result is not None and result.exception_info is not None and error is None:
        info = result.exception_info
        error = f"{info.exception_type}: {info.exception_message}"
        kind = classify_failure(info.exception_type, info.exception_message, _phase(result))
    rewards = result.verifier_result.rewards if result and result.verifier_result else None
    reward = _reward(rewards)
    if error is None and reward is None:
        error, kind = NO_REWARD, "verifier"
    if door_failures and kind not in ("platform", "verifier") and (reward is None or reward < 1.0):
        # The harness met a platform failure at its model door and did not succeed: not its zero.
        error = (f"the model door failed {door_failures['count']} call(s) on the platform's side "
                 f"(last: {door_failures.get('last')}); the harness then " +
                 (f"failed: {error}" if error else f"scored {reward}"))
        reward, kind = None, "platform"
    return TrialOutcome(
        task_id=req.task.id,
        attempt=req.attempt,
        reward=reward,
        trajectory=_read_json(paths.agent_dir / TRAJECTORY_FILE),
        verifier_output=_read_text(paths.test_stdout_path),
        agent_output=_agent_output(paths.agent_dir, req.agent),
        error=error,
        sandbox_id=sandbox_id,
        started_at=started_at,
        finished_at=_now(),
        result_path=str(paths.result_path) if paths.result_path.is_file() else None,
        failure_kind=kind if error is not None else None,
        judge=judge,
    )


def _phase(result: TrialResult) -> Phase:
    """Where the trial was when Harbor recorded its exception: the last phase it started."""
    if result.verifier is not None and result.verifier.started_at is not None:
        return "verify"
    if any(t is not None and t.started_at is not None for t in (result.agent_setup, result.agent_execution)):
        return "agent"
    return "prepare"


async def create_trial(config: TrialConfig) -> Trial:
    """Harbor's ``Trial.create`` for a single-step task, with the verifier always in a separate
    environment, whatever the task says.

    Harbor's own separation, enforced: when the agent phase ends Harbor collects the task's
    declared ``artifacts`` and *stops the agent's sandbox* (every process of the harness dies
    with its PID namespace: a detached daemon, a double fork, a process that ignores SIGTERM),
    then verifies in a fresh sandbox that holds the task's environment, the uploaded outputs and
    the tests — nothing the harness left running, and no reward file it wrote. The oracle and
    do-nothing runs of benchmark validation go the same way.
    """
    Trial._resolve_agent_skills(config)
    view: task_views.TaskView | None = None
    if task_views.cacheable(config):  # Harbor's view of the task, built once per content
        task, view = await task_views.load(config)
        download = view.download
    else:
        task, download = await Trial._load_task(config)
    if task.has_steps:
        raise ValueError(f"task {task.name}: multi-step tasks are not supported by the gym's trials")
    task.config.verifier.environment_mode = VerifierEnvironmentMode.SEPARATE
    for warning in check_trial_config(task.config, config.environment, config.verifier):
        log.info("task %s: %s", task.name, warning)
    return ViewTrial(config, view=view, _task=task, _task_download_result=download)


class ViewTrial(SingleStepTrial):
    """Harbor's single-step trial whose ``lock.json`` takes its task's entry (the content digest
    Harbor would hash the directory again for) from the task's view (services/evaluation/task_views.py)."""

    def __init__(self, config: TrialConfig, *, view: task_views.TaskView | None, **kwargs: Any) -> None:
        self._view = view  # read by _write_trial_lock, which Trial.__init__ calls
        super().__init__(config, **kwargs)

    def _write_trial_lock(self) -> TrialLock:
        if self._view is None:
            return super()._write_trial_lock()
        lock = task_views.trial_lock(self.config, self._view)
        self.paths.lock_path.write_text(lock.model_dump_json(indent=4, exclude_none=True))
        return lock


def build_trial_config(req: TrialRequest, trial_name: str) -> TrialConfig:
    """Harbor's configuration of this trial (nothing secret in it: Harbor writes it to disk)."""
    task_config = req.task.config
    if task_config is None:
        raise ValueError(f"task {req.task.id}: Harbor refuses its task.toml")
    agent = _agent_config(req, task_config.metadata)
    agent_timeout = req.agent_timeout_s or task_config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S
    verifier_timeout = req.verifier_timeout_s or task_config.verifier.timeout_sec or DEFAULT_VERIFIER_TIMEOUT_S
    lifetime = int(AGENT_SETUP_TIMEOUT_S + agent_timeout + verifier_timeout + SANDBOX_MARGIN_S)
    return TrialConfig(
        task=TaskConfig(path=req.task.path),
        trial_name=trial_name,
        trials_dir=req.trials_dir,
        agent=agent,
        environment=EnvironmentConfig(
            import_path=ENVIRONMENT_IMPORT_PATH,
            kwargs={
                "gateway_url": req.gateway_url.rstrip("/"),
                "template": req.template,
                "sandbox_timeout_sec": min(lifetime, MAX_SANDBOX_TIMEOUT_S),
                "door": req.agent == "harness",
                "metadata": {"rsigym.task_id": req.task.id[:200], "rsigym.attempt": str(req.attempt)},
            },
        ),
        verifier=VerifierConfig(override_timeout_sec=req.verifier_timeout_s),
    )


def _agent_config(req: TrialRequest, metadata: dict[str, Any]) -> AgentConfig:
    timeout = {"override_timeout_sec": req.agent_timeout_s} if req.agent_timeout_s else {}
    if req.agent == "oracle":
        return AgentConfig(name="oracle", **timeout)
    if req.agent == "nop":
        return AgentConfig(name="nop", **timeout)
    if req.agent != "harness":
        raise ValueError(f"unknown agent {req.agent!r}; expected harness, oracle or nop")
    if req.harness_dir is None:
        raise ValueError("a harness trial needs harness_dir")
    if not req.model:
        raise ValueError("a harness trial needs a model")
    return AgentConfig(
        import_path=HARNESS_AGENT_IMPORT_PATH,
        model_name=req.model,
        kwargs={"harness_dir": str(Path(req.harness_dir).resolve()), "sampling": dict(req.sampling or {}),
                "task_metadata": dict(metadata)},
        **timeout,
    )


def _reward(rewards: dict[str, Any] | None) -> float | None:
    if not rewards:
        return None
    value = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _agent_output(agent_dir: Path, agent: str) -> str:
    if agent == "oracle":
        return _read_text(agent_dir / "oracle.txt")
    if agent != "harness":
        return ""
    parts = []
    for name, label in ((INSTALL_LOG, "install"), (RUN_EXIT_CODE, "exit code"), (RUN_STDOUT, "stdout"),
                        (RUN_STDERR, "stderr")):
        path = agent_dir / name
        if path.is_file():
            parts.append(f"--- {label}\n{_read_text(path)}")
    return _tail("\n".join(parts))


def unbuilt_outcome(req: TrialRequest, reason: str) -> TrialOutcome:
    """The trial of a task whose Dockerfile could not be built (services/evaluation/templates.py):
    not run; the benchmark's own failure (``verifier``), never the agent's."""
    return _outcome(req, _now(), error=f"the task's Dockerfile could not be built: {reason}", kind="verifier")


def _outcome(req: TrialRequest, started_at: str, *, error: str, kind: FailureKind) -> TrialOutcome:
    return TrialOutcome(task_id=req.task.id, attempt=req.attempt, reward=None, trajectory=None, verifier_output="",
                        agent_output="", error=error, sandbox_id=None, started_at=started_at, finished_at=_now(),
                        result_path=None, failure_kind=kind)


def _read_text(path: Path) -> str:
    try:
        return _tail(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return ""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _tail(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT_CHARS else "…" + text[-MAX_OUTPUT_CHARS:]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64] or "task"


def _now() -> str:
    return datetime.now(UTC).isoformat()
