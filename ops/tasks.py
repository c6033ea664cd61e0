"""Tasks: what a run of a track is (operator-side; ``rsigym tasks list|show``, the launcher).

A task is a directory under ``tasks/`` (the shipped ones; ``--tasks-dir`` for others)::

    tasks/<name>/task.toml        [task] [budget] [limits] [egress] [preset.overrides]
    tasks/<name>/instruction.md   a Jinja2 template the research agent reads, rendered here

``instruction.md`` is rendered from the task and from the *effective* policy — the track preset
rendered against the gym config (access/presets.py) with the task's overrides and
token-rate limits laid over it — so the fixed hyper-parameters, allowed models and revoked
services the text names are the ones the run key really gets, never hand-copied. Templates
may include shared pieces from ``<tasks root>/_shared/`` (directories starting with ``_`` are
not tasks).

A task's ``[preset.overrides]`` may only narrow its track's preset (checked with
:meth:`Policy.assert_within`): a task cannot grant what the track does not.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, field_validator

from access.generations import InitialSystem, with_initial_checkpoint
from access.policy import Policy
from access.presets import budget_usd, preset_policy, submission_needs, track_label
from billing.deadlines import parse_duration
from kit.config import GymConfig
from kit.errors import GymError, Unprocessable, validated

TASKS = Path(__file__).resolve().parents[1] / "tasks"
"""The shipped tasks (found like ops/demo.py finds benchmarks/)."""
SKILLS = Path("agent_container/skills")
"""Where the per-service skills documents live (linked by path from every instruction)."""
SERVICES = ("rollout", "training", "inference", "sandbox", "evaluation", "records")
"""Every service a run key may be granted (to say in the instruction which ones are revoked)."""
NAMED_BUDGETS = ("small", "standard", "large")
_NAME = r"^[a-z0-9][a-z0-9-]{0,63}$"
_HOST = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:\d{1,5})?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskInfo(_Strict):
    name: str = Field(pattern=_NAME)
    """Must equal the task directory's name."""
    track: Literal["data", "harness", "joint"]
    offline: bool = False
    benchmarks: list[str] = Field(min_length=1)
    description: str = Field(min_length=1)


class TaskBudget(_Strict):
    service_usd: float | str
    """The run's service budget: USD, or a named budget of the track's preset (small, standard, large)."""
    agent_model_usd: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """The research agent's own model (``/agent/v1``), a meter apart from the service budget."""

    @field_validator("service_usd", mode="before")
    @classmethod
    def _usd_or_named(cls, v: Any) -> float | str:
        if isinstance(v, str) and v in NAMED_BUDGETS:
            return v
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < float("inf"):
            return float(v)
        raise ValueError(f"must be a number of USD >= 0 or one of {', '.join(NAMED_BUDGETS)}")


class TokenRates(_Strict):
    rollout: int | None = Field(default=None, gt=0)
    """Tokens per minute the run key may reserve on rollout (policy ``tokens_per_minute``)."""
    agent: int | None = Field(default=None, gt=0)
    """Tokens per minute on the agent route (``/agent/v1``)."""


class TaskLimits(_Strict):
    wall_clock: str
    """The run's wall-clock limit (``90m``, ``2h``, ``1d``): the run key's deadline."""
    tokens_per_minute: TokenRates = Field(default_factory=TokenRates)

    @field_validator("wall_clock")
    @classmethod
    def _duration(cls, v: str) -> str:
        parse_duration(v)  # ValueError names the accepted forms
        return v

    @property
    def wall_clock_s(self) -> float:
        return parse_duration(self.wall_clock)


class TaskEgress(_Strict):
    allow: list[str] = Field(default_factory=list)
    """Hosts (``host`` or ``host:port``, ``*.domain``) the agent container may reach besides the
    gateway; none by default."""

    @field_validator("allow")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for host in v:
            if not _HOST.match(host):
                raise ValueError(f"{host!r} is not a host name (write e.g. pypi.org or *.example.com:443)")
        return v


class TaskPreset(_Strict):
    overrides: dict[str, Any] = Field(default_factory=dict)
    """A partial policy (``services.<name>.<setting>``) laid over the track preset; it must stay
    within the preset."""


class Task(_Strict):
    task: TaskInfo
    budget: TaskBudget
    limits: TaskLimits
    egress: TaskEgress = Field(default_factory=TaskEgress)
    preset: TaskPreset = Field(default_factory=TaskPreset)
    path: Path | None = Field(default=None, exclude=True)
    """The task directory (set by :func:`load_task`)."""

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def track_label(self) -> str:
        return track_label(self.task.track, self.task.offline)

    @property
    def service_budget_usd(self) -> float:
        return budget_usd(self.task.track, self.budget.service_usd)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "track": self.task.track, "offline": self.task.offline,
                "benchmarks": self.task.benchmarks, "description": self.task.description,
                "budget_usd": self.service_budget_usd, "agent_budget_usd": self.budget.agent_model_usd,
                "wall_clock": self.limits.wall_clock, "egress": self.egress.allow}


def _refuse(where: Path, message: str, param: str | None = None) -> Unprocessable:
    return Unprocessable(f"invalid task {where}: {message}", param=param)


def load_task(directory: Path | str) -> Task:
    """Read and validate ``<directory>/task.toml`` (and check ``instruction.md`` is there).

    Refusals are :class:`Unprocessable` naming the file and the field."""
    directory = Path(directory)
    toml_path = directory / "task.toml"
    try:
        data = tomllib.loads(toml_path.read_text())
    except FileNotFoundError:
        raise _refuse(toml_path, "no such file") from None
    except tomllib.TOMLDecodeError as err:
        raise _refuse(toml_path, f"not valid TOML: {err}") from None
    task = validated(Task, data, what=f"task {toml_path}")
    if task.name != directory.name:
        raise _refuse(toml_path, f"task.name {task.name!r} must equal its directory's name {directory.name!r}",
                      param="task.name")
    if task.task.offline and task.egress.allow:
        raise _refuse(toml_path, "egress.allow must be empty for an offline task (no public internet for the agent)",
                      param="egress.allow")
    if not (directory / "instruction.md").is_file():
        raise _refuse(directory / "instruction.md", "no such file")
    # The overrides' shape now; whether they stay within the preset needs the gym config (task_policy).
    validated(Policy, task.preset.overrides, what=f"task {toml_path}", prefix="preset.overrides.")
    return task.model_copy(update={"path": directory})


def list_tasks(root: Path | str = TASKS) -> list[Task]:
    """Every task under ``root`` (directories holding a task.toml, not starting with ``_``), by name."""
    root = Path(root)
    if not root.is_dir():
        raise Unprocessable(f"no tasks directory at {root}", param="tasks_dir")
    return [load_task(d) for d in sorted(root.iterdir())
            if d.is_dir() and not d.name.startswith((".", "_")) and (d / "task.toml").is_file()]


def find_task(name: str, root: Path | str = TASKS) -> Task:
    directory = Path(root) / name
    if not re.match(_NAME, name) or not (directory / "task.toml").is_file():
        known = ", ".join(t.name for t in list_tasks(root)) or "none"
        raise Unprocessable(f"no task {name!r} in {root} (tasks: {known})", param="task")
    return load_task(directory)


def _lay_overrides(preset: Policy, task: Task, where: Path) -> Policy:
    raw = preset.model_dump(mode="json", exclude_none=False)
    overrides = copy.deepcopy(task.preset.overrides)
    unknown = set(overrides) - {"services"}
    if unknown:
        raise _refuse(where, f"preset.overrides: unknown key {sorted(unknown)[0]!r} (overrides hold services.<name>)",
                      param=f"preset.overrides.{sorted(unknown)[0]}")
    for name, settings in (overrides.get("services") or {}).items():
        if name not in raw["services"]:
            raise _refuse(where, f"preset.overrides.services.{name}: the {task.task.track} track does not grant "
                                 f"the {name} service", param=f"preset.overrides.services.{name}")
        if not isinstance(settings, dict):
            raise _refuse(where, f"preset.overrides.services.{name} must be a table",
                          param=f"preset.overrides.services.{name}")
        fields = settings.pop("fields", None) or {}
        raw["services"][name].update(settings)
        raw["services"][name]["fields"].update(fields)
    rates = task.limits.tokens_per_minute
    rollout = raw["services"].get("rollout")
    if rollout is not None and rates.rollout is not None:
        mine = rollout.get("tokens_per_minute")
        rollout["tokens_per_minute"] = rates.rollout if mine is None else min(mine, rates.rollout)
    if rates.agent is not None:  # the agent route: a limit only (the run's meter grants it; access/policy.py)
        agent = raw["services"].setdefault("agent", {})
        mine = agent.get("tokens_per_minute")
        agent["tokens_per_minute"] = rates.agent if mine is None else min(mine, rates.agent)
    policy = validated(Policy, raw, what=f"task {where}", prefix="preset.overrides.")
    try:
        policy.assert_within(preset)
    except GymError as err:
        raise _refuse(where, f"preset.overrides widen the {task.track_label} preset: {err.message}",
                      param=f"preset.overrides.{err.param}" if err.param else "preset.overrides") from None
    return policy


def task_policy(task: Task, config: GymConfig) -> Policy:
    """The run key's policy: the track preset rendered against ``config``, the task's overrides
    and token rates (rollout; the agent route as ``services.agent``) laid over it (never wider
    than the preset)."""
    preset = preset_policy(task.task.track, config, offline=task.task.offline)
    return _lay_overrides(preset, task, (task.path or Path(task.name)) / "task.toml")


def key_body(task: Task, config: GymConfig, *, budget: float | str | None = None) -> dict[str, Any]:
    """What a launcher POSTs to ``/admin/v1/keys`` for a run of ``task`` (gateway/schemas.py
    CreateKey). ``policy`` is present only when the task's policy differs from the preset (its
    overrides or token rates): the admin route then has to accept a policy next to a track."""
    usd = budget_usd(task.task.track, budget) if budget is not None else task.service_budget_usd
    body: dict[str, Any] = {"track": task.task.track, "offline": task.task.offline, "budget_usd": usd,
                            "agent_budget_usd": task.budget.agent_model_usd,
                            "deadline_s": task.limits.wall_clock_s, "name": task.name}
    policy = task_policy(task, config)
    if policy != preset_policy(task.task.track, config, offline=task.task.offline):
        body["policy"] = policy.model_dump(mode="json", exclude_none=True)
    return body


def fixed_fields(policy: Policy, service: str) -> dict[str, Any]:
    """``{path: value}`` of every field the policy fixes for ``service``."""
    rules = policy.service(service)
    if rules is None:
        return {}
    return {path: rule.arg for path, rule in rules.fields.items() if rule.kind == "fixed"}


def render_instruction(task: Task, config: GymConfig, generation: dict[str, Any] | None = None) -> str:
    """The task's ``instruction.md`` rendered (Jinja2, undefined names refused) from the task and
    the effective policy. Templates see: ``task``, ``track``, ``offline``, ``benchmarks``,
    ``policy`` (services → settings), ``granted``/``revoked`` (service names), ``fixed``
    (service → {field: value}), ``models`` (service → allowlist or ``"*"``), ``needs``
    (submission artifacts), ``budget_usd``, ``agent_budget_usd``, ``wall_clock``,
    ``tokens_per_minute``, ``egress``, ``skills`` (service → skills document path), ``generation``
    (the run's generation, 1 without ``--from``) and ``initial_system`` (``generation``: the minted run
    key's view of a run started with ``--from``, access/generations.py: its checkpoint id, harness id,
    weights hash; None otherwise)."""
    if task.path is None:
        raise Unprocessable(f"task {task.name} was not loaded from a directory", param="task")
    policy = task_policy(task, config)
    initial = (generation or {}).get("initial_system")
    if initial:  # the fixed base follows the system the run starts from (as the key's policy does)
        policy = with_initial_checkpoint(policy, InitialSystem(
            submission_id=initial.get("submission") or "", model=initial["model"], harness=initial["harness"],
            weights_hash=initial.get("weights_hash"), base_model=initial.get("base_model") or "", audit_id=""))
    root = task.path.parent
    env = jinja2.Environment(loader=jinja2.FileSystemLoader([str(task.path), str(root)]),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    granted = [s for s in SERVICES if s in policy.services]
    context = {
        "task": task.task, "track": task.task.track, "offline": task.task.offline, "label": task.track_label,
        "benchmarks": task.task.benchmarks, "policy": policy.model_dump(mode="json")["services"],
        "granted": granted, "revoked": [s for s in SERVICES if s not in policy.services],
        "fixed": {s: fixed_fields(policy, s) for s in granted},
        "models": {s: policy.services[s].models for s in granted},
        "needs": list(submission_needs(task.track_label)), "budget_usd": task.service_budget_usd,
        "agent_budget_usd": task.budget.agent_model_usd, "wall_clock": task.limits.wall_clock,
        "tokens_per_minute": task.limits.tokens_per_minute.model_dump(), "egress": task.egress.allow,
        "skills": {s: str(SKILLS / f"{s}.md") for s in granted},
        "generation": (generation or {}).get("generation") or 1,
        "from_run": (generation or {}).get("from_run"), "initial_system": initial,
    }
    try:
        return env.get_template("instruction.md").render(**context)
    except jinja2.TemplateError as err:
        where = getattr(err, "filename", None) or task.path / "instruction.md"
        lineno = getattr(err, "lineno", None)
        line = f" line {lineno}" if lineno else ""
        raise _refuse(Path(where), f"template error{line}: {err.message or err}") from None
