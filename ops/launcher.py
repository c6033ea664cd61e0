"""The run launcher (``rsigym run start|list|show|stop|logs``): embedded mode below; compose mode
(:func:`compose_plan`) runs the agent in its track's container with ``docker compose run`` and the
same supervisor stops it at the wall clock. A task's egress allowlist is served by kit/egress.py
(embedded: on a socket the in-namespace relay exposes at 127.0.0.1:8701; compose: a per-run
``egress`` container).

``start`` mints the run key through the admin API (the task's key body), renders the instruction
into ``<data-dir>/runs/<run>/`` (0700) and starts a detached *supervisor* (``python -m
ops.launcher supervise DIR``, its own session) which:

* takes an unprivileged uid of the host's pool for the agent (when the gym runs as root);
* serves ``DIR/sock/gateway.sock``, relaying every connection to the gateway's host and port;
* starts the agent under bubblewrap as ops/agent_namespace.py lays out — its own uid, no
  capability, the sandboxes' seccomp filter, every namespace unshared (network included), the
  host's system directories and a minimal /etc read-only, a fresh HOME, the instruction, the
  agent's files and the socket directory bound; the data dir, the store, provider keys and the
  admin token are not there, and the run key is in its environment, never on a command line;
* inside, kit/namespace_relay.py listens on 127.0.0.1:8700 (the agent's ``RSIGYM_URL``) and
  relays to that socket: the agent's only network reach is the gateway;
* follows the run at the gateway (ops/run_watch.py): reports the agent started (``created`` →
  ``running``), freezes the agent while the run is paused (its wall clock stands still), and kills
  it when the run ends there — its deadline, the operator's stop from anywhere, a revocation;
* records the exit in ``run.json``, sweeps the agent's uid and gives its HOME back to the gym;
* ends the run at the gateway (``POST /admin/v1/keys/{id}/end``: its keys closed, the reaper stops
  its jobs and sandboxes) with why it ended (access/lifecycle.py): ``finished`` (exit 0),
  ``deadline`` (124), ``failed_to_start`` (125-127, or the supervisor failed before the agent ran),
  ``crashed`` (any other exit).

``stop`` asks the supervisor to end the run (SIGTERM: it cleans up as above), kills what is left of
its process group, and ends the run at the gateway (``stopped``).

The run key records the run's task, agent (name and version) and the agent's model; reports
group runs by that agent.

``start_run(repeat=…)`` (``rsigym run start --repeat N [--seed S]``, :func:`repeat_slots`): one
run of N of one agent on one task, each its own key and run; the group is in the run key's name
(access/repeats.py), the index and the seed in ``run.json``. The seed reaches the agent through
its template's ``seed_flag`` (the gym's baseline and dag agents seed what they ask the gym to
sample with it); LLM agents are repeated, not seeded.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from access import repeats
from access.lifecycle import RunState, exit_reason, run_state
from kit import namespace_relay
from kit.config import GYM_AGENT_PREFIX, GymConfig
from kit.egress import HEAD_LIMIT, EgressPolicy, EgressProxy, proxy_env
from kit.errors import Conflict, NotFound, ServiceUnavailable, Unprocessable
from kit.host_uids import HostUidPool, kill_uid, pid_running
from kit.namespace_relay import _pipe  # the same byte pipe the in-namespace relay runs
from kit.private_files import open_private, restrict_umask, write_private
from ops import agent_namespace as ns
from ops import agent_setup, agent_toolbox, launcher_compose, run_watch
from ops.launcher_compose import ComposeTarget, compose_plan
from services.sandbox import seccomp

AGENTS = Path(__file__).with_name("agents.toml")
AGENT_FILES = Path(__file__).resolve().parents[1] / "agent_container" / "agents"
HARNESS_FILES = AGENT_FILES.parent / "harness"
RELAY = Path(namespace_relay.__file__)
INSIDE_PORT = 8700
INSIDE_URL = f"http://127.0.0.1:{INSIDE_PORT}"
EGRESS_PORT = 8701
"""Inside, the egress proxy's address (only when the task allows a host): ``HTTPS_PROXY``."""
HOME_INSIDE, INSTRUCTION_INSIDE = ns.HOME_INSIDE, ns.INSTRUCTION_INSIDE
STOP_WAIT_S = 10.0
"""How long ``stop`` waits for the supervisor to clean up before it kills its process group."""


class AgentTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    command: list[str] = Field(min_length=1)
    """argv; ``{instruction}`` becomes the instruction's path inside."""
    binds: list[str] = Field(default_factory=list)
    """Extra host paths bound read-only at the same place (an operator-installed CLI)."""
    compose_command: list[str] | None = None
    """argv in compose mode (the agent image's paths), when it differs from ``command``."""
    npm: list[str] = Field(default_factory=list)
    """Pinned npm packages (``name@version``) the agent runs from the toolbox (ops/agent_toolbox.py:
    ``rsigym agents install NAME``); a run of an agent whose packages are missing is refused."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment (nothing secret: it is in the registry); ``{agent_model}`` and
    ``{agent_max_output_tokens}`` (the most ``max_tokens`` the agent route grants that model) are
    replaced."""
    seed_flag: str | None = None
    """The option through which the agent takes a seed (``--seed``): ``rsigym run start --seed S``
    passes ``S + i`` to the i-th of its runs (from 0). None: the agent is not seeded — an LLM agent
    (claude-code, codex) samples on its provider's side; its runs are repeated, not seeded, and
    ``--seed`` is refused for it."""
    setup: str | None = None
    """Configuration files written into the agent's fresh HOME (ops/agent_setup.py: ``claude-code``,
    ``codex``): the agent route, the MCP server ``gym``, their own sandbox and update checks off."""

    @model_validator(mode="after")
    def _known_setup(self) -> AgentTemplate:
        if self.setup is not None and self.setup not in agent_setup.WRITERS:
            raise ValueError(f"setup {self.setup!r} is not one of {sorted(agent_setup.WRITERS)}")
        if any(spec.rpartition("@")[0] in ("", "@") for spec in self.npm):
            raise ValueError("npm packages are pinned: name@version")
        return self

    def version(self) -> str:
        """The version a run records: its pinned CLI's (the first npm package), else the gym's own
        (the gym's agents ship with it)."""
        if self.npm:
            return self.npm[0].rpartition("@")[2]
        try:
            return metadata.version("rsigym")
        except metadata.PackageNotFoundError:
            return "unknown"

    def needs_agent_model(self) -> bool:
        return self.setup is not None or any("{agent_model}" in part for part in [*self.command,
                                                                                 *self.env.values()])


class RunRecord(BaseModel):
    """``<data-dir>/runs/<run>/run.json``."""

    run: str
    key_id: str
    task: str
    agent: str
    agent_version: str | None = None
    agent_model: str | None = None
    pid: int
    started_at: str
    deadline_s: float
    mode: str = "embedded"
    """embedded (bubblewrap on this host) or compose (the track's agent container)."""
    egress: list[str] = Field(default_factory=list)
    """The task's egress allowlist (hosts the agent reaches through the egress proxy)."""
    status: str = "running"
    """running, exited, stopped (the supervisor's own view; :attr:`state` is the run's)."""
    exit_code: int | None = None
    ended_at: str | None = None
    reason: str | None = None
    """Why the run ended (access/lifecycle.py END_REASONS), as recorded here and at the gateway."""
    repeat_group: str | None = None
    """``rsigym run start --repeat N``: the group of runs started together (access/repeats.py; also
    in the run key's name); None: a run started alone."""
    repeat_index: int | None = None
    """Its place in the group, from 0 (operator side only: its agent never sees it)."""
    repeat_count: int | None = None
    seed: int | None = None
    """The seed passed to the agent (its template's ``seed_flag``); None: not seeded."""
    state: str | None = None
    """The run's lifecycle state (``run list/show``: the gateway's, which knows pauses, audits and
    scores; else :meth:`local_state`)."""
    generation: int = 1
    """The run's generation (access/generations.py): 1 unless started with ``--from``."""
    from_run: str | None = None
    initial_system: dict[str, Any] | None = None
    """``--from``: the system it starts from (model, harness, weights_hash, base_model, submission)."""

    def local_state(self, now: datetime | None = None) -> RunState:
        """The state from this record's facts alone (the gym unreachable)."""
        deadline = datetime.fromisoformat(self.started_at) + timedelta(seconds=self.deadline_s)
        return run_state(key_status="active", ends_at=deadline, end_reason=self.reason, now=now)


class KeyMinter(Protocol):
    def create_key(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def set_deadline(self, key_id: str, deadline_s: float) -> dict[str, Any]: ...
    def end_run(self, key_id: str, reason: str, agent_exit: int | None = None) -> dict[str, Any]: ...


def load_agents(path: Path = AGENTS) -> dict[str, AgentTemplate]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise Unprocessable(f"cannot read the agents registry {path}: {err}", param="agent") from None
    return {name: AgentTemplate.model_validate(raw) for name, raw in (data.get("agents") or {}).items()}


def runs_root(data_dir: Path) -> Path:
    return Path(data_dir) / "runs"


def agent_env(key: str, egress: bool = False, extra: dict[str, str] | None = None,
              path: list[str] | None = None) -> dict[str, str]:
    """Everything the agent's environment holds, and nothing else: bubblewrap's own environment,
    which it passes on (the key is never on a command line). ``extra``: the template's own
    (non-secret) variables; ``path``: the toolbox's program directories, ahead of the system's."""
    env = {**(extra or {}), "RSIGYM_URL": INSIDE_URL, "RSIGYM_API_KEY": key,
           "OPENAI_BASE_URL": f"{INSIDE_URL}/agent/v1", "OPENAI_API_KEY": key,
           "ANTHROPIC_BASE_URL": f"{INSIDE_URL}/agent", "ANTHROPIC_API_KEY": key,
           "PATH": ":".join([*(path or []), "/usr/local/bin:/usr/bin:/bin"]), "HOME": HOME_INSIDE,
           "RSIGYM_INSTRUCTION": INSTRUCTION_INSIDE}
    if egress:
        env |= proxy_env(f"http://127.0.0.1:{EGRESS_PORT}", "127.0.0.1")
    return env


def _placeholders(template: AgentTemplate, agent: str, config: GymConfig, chosen: str | None = None) -> dict[str, str]:
    """The placeholders of an agent that names its model: ``chosen`` (``rsigym run start
    --agent-model``: a catalogue agent model, or one of the gym's own, ``gym:<base model>``,
    ``gym:<checkpoint id>``, ``gym:from:<run>``), else the gym's first agent model (``agent_models``
    in its config), and the most output tokens the agent route grants it. A ``gym:`` model's
    eligibility (an ended run's accepted, scored submission; never the run's own) is checked by
    the gym on every call (services/inference/agent_models.py)."""
    if chosen is not None:
        if chosen.startswith(GYM_AGENT_PREFIX):
            if not chosen.removeprefix(GYM_AGENT_PREFIX).removeprefix("from:"):
                raise Unprocessable("--agent-model gym:<base model>|gym:<checkpoint id>|gym:from:<run>",
                                    param="agent_model")
            return {"{agent_model}": chosen, "{agent_max_output_tokens}": str(config.inference.max_tokens_cap)}
        if next((m for m in config.agent_models if m.name == chosen), None) is None:
            raise Unprocessable(f"--agent-model {chosen!r} is neither one of this gym's agent models nor gym:<model>",
                                param="agent_model")
    if not template.needs_agent_model() and chosen is None:
        return {}
    if not config.agent_models:
        raise Unprocessable(f"agent {agent!r} needs an agent model, and this gym's config has no agent_models "
                            "(docs/operator-guide.md: the agent route)", param="agent")
    model = next(m for m in config.agent_models if m.name == chosen) if chosen is not None else config.agent_models[0]
    return {"{agent_model}": model.name,
            "{agent_max_output_tokens}": str(model.max_output_tokens or config.rollout.max_tokens_cap)}


def _fill(parts: list[str], placeholders: dict[str, str]) -> list[str]:
    out = []
    for part in parts:
        for name, value in {"{instruction}": INSTRUCTION_INSIDE, **placeholders}.items():
            part = part.replace(name, value)
        out.append(part)
    return out


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Repeat(BaseModel):
    """One run of ``rsigym run start --repeat N [--seed S]``: its group, its place and its seed."""

    group: str
    index: int
    count: int
    seed: int | None = None


def seed_args(template: AgentTemplate, agent: str, seed: int | None, extra_args: list[str]) -> list[str]:
    """The agent's seed option (``[seed_flag, seed]``), or none; refused for an agent that takes no
    seed (an LLM agent: repeated, not seeded) and when ``extra_args`` set the option themselves."""
    if seed is None:
        return []
    if template.seed_flag is None:
        raise Unprocessable(f"agent {agent!r} takes no seed: an LLM agent samples on its provider's side, so its "
                            "runs are repeated, not seeded (--repeat N without --seed)", param="seed")
    if any(a == template.seed_flag or a.startswith(template.seed_flag + "=") for a in extra_args):
        raise Unprocessable(f"give the seed with --seed, not {template.seed_flag} after --", param="seed")
    return [template.seed_flag, str(seed)]


def repeat_slots(count: int, seed: int | None = None) -> list[Repeat | None]:
    """The runs of ``rsigym run start --repeat N [--seed S]``: one repeat group whose i-th run
    (from 0) gets seed ``S + i``; a lone unseeded run is in no group (``[None]``)."""
    if count < 1:
        raise Unprocessable("--repeat is at least 1", param="repeat")
    if count == 1 and seed is None:
        return [None]
    group = repeats.new_group()
    return [Repeat(group=group, index=i, count=count, seed=None if seed is None else seed + i) for i in range(count)]


def start_run(*, data_dir: Path, gateway_url: str, client: KeyMinter, task: Any, key_body: dict[str, Any],
              instruction: str | Callable[[dict[str, Any]], str], agent: str, config: GymConfig,
              extra_args: list[str] | None = None, agents_file: Path = AGENTS, compose: ComposeTarget | None = None,
              repeat: Repeat | None = None, from_run: str | None = None,
              chosen_agent_model: str | None = None) -> RunRecord:
    """Mint the run key, lay out the run directory and start the supervisor; the run's record.
    ``compose`` set: compose mode (the track's agent container), else embedded (bubblewrap here).
    ``repeat``: one run of a repeat group (its key named for the group, its seed passed to the agent).
    ``from_run``: the run starts from that run's accepted system (``--from``; refused, no key is
    minted, unless it was scored and its audit accepted it). ``instruction`` may be rendered from
    the minted key's view (its ``generation`` and ``initial_system``)."""
    agents = load_agents(agents_file)
    if agent not in agents:
        raise Unprocessable(f"no agent {agent!r} (agents: {', '.join(sorted(agents)) or 'none'})", param="agent")
    egress = list(getattr(getattr(task, "egress", None), "allow", []) or [])
    template = agents[agent]
    extra_args = seed_args(template, agent, repeat.seed if repeat else None, extra_args or []) + (extra_args or [])
    if repeat is not None:
        key_body = {**key_body, "name": repeats.key_name(str(key_body.get("name") or task.name), repeat.group)}
    placeholders = _placeholders(template, agent, config, chosen_agent_model)  # --agent-model, else the first
    agent_model = placeholders.get("{agent_model}", "")
    env = dict(zip(template.env, _fill(list(template.env.values()), placeholders), strict=True))
    if compose is None and (absent := agent_toolbox.missing(template.npm)):
        raise Unprocessable(f"agent {agent!r} runs {', '.join(absent)}, which is not installed in the agents' "
                            f"toolbox ({agent_toolbox.toolbox_dir()}): run `rsigym agents install {agent}`",
                            param="agent")
    bwrap = shutil.which("bwrap")
    if compose is None and bwrap is None:
        raise ServiceUnavailable("the embedded launcher needs bubblewrap (bwrap) on this host")
    if compose is not None and shutil.which(compose.docker) is None:
        raise ServiceUnavailable(f"compose mode needs the docker CLI ({compose.docker!r} is not on PATH)")
    minted = client.create_key({**key_body, "run": {"task": task.name, "agent": agent, "agent_version": template.version(),
                                                    "agent_model": agent_model or None,
                                                    **({"from_run": from_run} if from_run else {})}})
    if callable(instruction):
        instruction = instruction(minted)
    run = minted.get("run_id") or minted["id"]
    runs = runs_root(data_dir)
    runs.mkdir(mode=0o700, parents=True, exist_ok=True)
    runs.chmod(0o700)
    run_dir = runs / run
    run_dir.mkdir(mode=0o700, exist_ok=True)
    run_dir.chmod(0o700)  # the run key, the agent's HOME and logs: the gym's alone
    write_private(run_dir / "instruction.md", instruction)  # the agent's uid is given it when the run starts
    seconds = float(key_body.get("deadline_s") or task.limits.wall_clock_s)
    plan: dict[str, Any]
    if compose is not None:
        (run_dir / "instruction.md").chmod(0o644)  # read by the container's non-root user
        command = _fill(template.compose_command or template.command, placeholders) + (extra_args or [])
        if template.setup:  # the image has the SDK (`gym`) and the pinned CLIs (agent_container/Dockerfile)
            setup_dir = run_dir / "setup"
            setup_dir.mkdir(mode=0o755, exist_ok=True)
            agent_setup.write(template.setup, setup_dir, uid=None, gateway_url=launcher_compose.relay_url(run),
                              agent_model=agent_model, gym="gym", mode=0o644)
        plan = compose_plan(compose, run=run, track=task.task.track, run_dir=run_dir, command=command,
                            egress=egress, key=minted["key"], setup=bool(template.setup),
                            env=env)
    else:
        # AF_UNIX paths are short (108 bytes): the sockets live in a short private directory, linked here.
        sock_dir = Path(tempfile.mkdtemp(prefix="rsigym-run-"))
        (run_dir / "sock").symlink_to(sock_dir, target_is_directory=True)
        plan = {"mode": "embedded", "key": minted["key"], "gateway_url": gateway_url, "egress": egress,
                "command": _fill(template.command, placeholders) + (extra_args or []),
                "binds": [*template.binds, *agent_toolbox.binds()], "path": agent_toolbox.path_entries(),
                "env": env,
                "setup": template.setup, "agent_model": agent_model, "gym": agent_toolbox.gym_command(),
                "uid_base": config.sandbox.uid_base}
    plan["seconds"] = seconds
    plan["admin_url"] = gateway_url  # the supervisor follows the run there and ends it when the agent exits
    plan["key_id"] = minted["id"]
    write_private(run_dir / "supervise.json", json.dumps(plan))  # the run key: operator side only, never bound inside
    with os.fdopen(open_private(run_dir / "agent.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ops.launcher", "supervise", str(run_dir)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    record = RunRecord(run=run, key_id=minted["id"], task=task.name, agent=agent, agent_version=template.version(),
                       agent_model=agent_model or None, pid=proc.pid, generation=minted.get("generation") or 1,
                       from_run=minted.get("from_run"), initial_system=minted.get("initial_system"),
                       started_at=_now(), deadline_s=seconds, mode=plan["mode"], egress=egress,
                       **({} if repeat is None else {"repeat_group": repeat.group, "repeat_index": repeat.index,
                                                     "repeat_count": repeat.count, "seed": repeat.seed}))
    _write(run_dir, record)
    return record


def _write(run_dir: Path, record: RunRecord) -> None:
    tmp = run_dir / "run.json.tmp"
    write_private(tmp, record.model_dump_json(indent=2))
    tmp.replace(run_dir / "run.json")


def show_run(data_dir: Path, run: str) -> RunRecord:
    path = runs_root(data_dir) / run / "run.json"
    if "/" in run or run.startswith(".") or not path.is_file():
        raise NotFound(f"no run {run!r} in {runs_root(data_dir)}", param="run")
    record = RunRecord.model_validate_json(path.read_text())
    if record.status == "running" and not pid_running(record.pid):
        record = record.model_copy(update={"status": "exited"})  # the supervisor died without recording it
    return record.model_copy(update={"state": str(record.local_state())})


def list_runs(data_dir: Path) -> list[RunRecord]:
    root = runs_root(data_dir)
    if not root.is_dir():
        return []
    return [show_run(data_dir, d.name) for d in sorted(root.iterdir()) if (d / "run.json").is_file()]


def stop_run(data_dir: Path, run: str, client: KeyMinter) -> RunRecord:
    """Kill the run's processes (and, in compose mode, remove its containers) and end the run at the
    gateway (its deadline set to now)."""
    record = show_run(data_dir, run)
    run_dir = runs_root(data_dir) / run
    if record.status == "running":
        _end_supervisor(record.pid)
        record = record.model_copy(update={"status": "stopped", "ended_at": _now(), "reason": "stopped",
                                           "state": None})
        _write(run_dir, record)
    elif record.status == "stopped":
        raise Conflict(f"run {run} is already stopped", param="run")
    if record.mode == "compose":
        launcher_compose.remove_run(json.loads((run_dir / "supervise.json").read_text()))
    _cleanup(run_dir)
    client.end_run(record.key_id, record.reason or "stopped", record.exit_code)  # the first recorded end stands
    return show_run(data_dir, run)


def _end_supervisor(pid: int) -> None:
    """SIGTERM to the supervisor (it kills the agent, sweeps its uid, closes its sockets), then
    SIGKILL to whatever of its process group is left."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while pid_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _cleanup(run_dir: Path) -> None:
    """Remove the run's private socket directory (and its link) once nothing serves it."""
    link = run_dir / "sock"
    if not link.is_symlink():
        return
    target = link.resolve()
    if target.name.startswith("rsigym-run-") and target.parent == Path(tempfile.gettempdir()).resolve():
        shutil.rmtree(target, ignore_errors=True)
    link.unlink()


def logs(data_dir: Path, run: str) -> str:
    show_run(data_dir, run)
    path = runs_root(data_dir) / run / "agent.log"
    return path.read_text(errors="replace") if path.is_file() else ""


# -- the supervisor (a detached process per run) ---------------------------------------------------

async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int) -> None:
    try:
        up_r, up_w = await asyncio.open_connection(host, port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))


async def serve_relay(host: str, port: int, gateway_url: str) -> None:
    """``rsigym run-relay``: a compose-mode run's own path to the gateway (ops/launcher_compose.py)."""
    url = httpx.URL(gateway_url)
    to_host, to_port = url.host, url.port or (443 if url.scheme == "https" else 80)
    server = await asyncio.start_server(lambda r, w: _relay(r, w, to_host, to_port), host, port)
    async with server:
        await server.serve_forever()


async def _supervise_embedded(run_dir: Path, plan: dict[str, Any]) -> run_watch.Outcome:
    url = httpx.URL(plan["gateway_url"])
    host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
    sock_dir = (run_dir / "sock").resolve()
    bwrap = ns.bwrap_path()
    if bwrap is None:
        print("rsigym: bubblewrap (bwrap) is gone from this host; the agent was not started", file=sys.stderr, flush=True)
        return run_watch.Outcome(127)
    uids = HostUidPool(int(plan["uid_base"])) if os.geteuid() == 0 else None
    uid = uids.take() if uids is not None else None
    servers: list[asyncio.AbstractServer] = []
    try:
        ns.prepare_host_side(run_dir, sock_dir, uid)
        if plan.get("setup"):
            agent_setup.write(plan["setup"], run_dir / "home", uid=uid, gateway_url=INSIDE_URL,
                              agent_model=plan["agent_model"], gym=plan["gym"])
        servers.append(await asyncio.start_unix_server(lambda r, w: _relay(r, w, host, port),
                                                       str(sock_dir / "gateway.sock")))
        if plan.get("egress"):
            proxy = EgressProxy(EgressPolicy(plan["egress"]), log=run_dir / "egress.log")
            servers.append(await asyncio.start_unix_server(proxy.handle, str(sock_dir / "egress.sock"),
                                                           limit=HEAD_LIMIT))
        ns.own_sockets(sock_dir, uid)
        seconds = float(plan["seconds"])
        filter_fd = seccomp.filter_fd()
        try:
            argv = ns.bwrap_argv(bwrap=bwrap, uid=uid, filter_fd=filter_fd, run_dir=run_dir, sock_dir=sock_dir,
                                 relay=RELAY, agents=AGENT_FILES, harnesses=HARNESS_FILES, binds=plan["binds"],
                                 command=plan["command"], port=INSIDE_PORT,
                                 egress_port=EGRESS_PORT if plan.get("egress") else None)
            agent = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, pass_fds=(filter_fd,),
                                                         env=agent_env(plan["key"], bool(plan.get("egress")),
                                                                       plan.get("env"), plan.get("path")),
                                                         umask=0o022)  # the supervisor's own is 0077
        finally:
            os.close(filter_fd)
        run = _run_at_gateway(run_dir, plan)
        await run.start()
        try:
            return await run_watch.follow(asyncio.ensure_future(agent.wait()), run_watch.ProcessTreeBox(agent), run,
                                          seconds)
        finally:
            if agent.returncode is None:
                agent.kill()  # bubblewrap; its PID namespace goes with it (--die-with-parent)
                await agent.wait()
    finally:
        for server in servers:
            server.close()
        if uid is not None and uids is not None:
            kill_uid(uid)
            ns.give_back(run_dir, uid)
            uids.free(uid)


async def _supervise(run_dir: Path) -> int:
    plan = json.loads((run_dir / "supervise.json").read_text())
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)  # `run stop`: clean up, then go
    outcome = run_watch.Outcome(None)
    try:
        if plan["mode"] == "compose":
            outcome = await launcher_compose.supervise(plan, _run_at_gateway(run_dir, plan))
        else:
            outcome = await _supervise_embedded(run_dir, plan)
    except Exception:  # noqa: BLE001 - whatever broke, the run ends and its key closes
        traceback.print_exc()
        print("rsigym: the supervisor failed; the run is ended", file=sys.stderr, flush=True)
    finally:
        _cleanup(run_dir)
    path = run_dir / "run.json"
    record = RunRecord.model_validate_json(path.read_text())
    code = outcome.code
    if record.status == "running":
        reason = outcome.reason or exit_reason(code)
        _end_at_gateway(run_dir, plan, record.key_id, reason, code)  # first: once `run show` says so, it has ended
        record = RunRecord.model_validate_json(path.read_text())  # `run stop` may have come meanwhile
        if record.status == "running":
            status = "exited" if outcome.reason in (None, "deadline") else "stopped"
            _write(run_dir, record.model_copy(update={"status": status, "exit_code": code, "ended_at": _now(),
                                                      "reason": reason}))
    return 1 if code is None else code


def _run_at_gateway(run_dir: Path, plan: dict[str, Any]) -> run_watch.AdminRun:
    """The run key at the gateway, read and reported with the operator's credentials (those of the
    ``rsigym run start`` that started this supervisor, or the data dir's admin token)."""
    from kit.settings import GymSettings
    from ops.cli.admin_client import AdminClient

    return run_watch.AdminRun(AdminClient(GymSettings(data_dir=run_dir.parent.parent), plan.get("admin_url")),
                              plan["key_id"])


def _end_at_gateway(run_dir: Path, plan: dict[str, Any], key_id: str, reason: str, code: int | None) -> None:
    """Close the run's keys at the gateway with why it ended (the operator's credentials: those of
    the ``rsigym run start`` that started this supervisor, or the data dir's admin token)."""
    from kit.settings import GymSettings
    from ops.cli.admin_client import AdminClient

    try:
        AdminClient(GymSettings(data_dir=run_dir.parent.parent), plan.get("admin_url")).end_run(key_id, reason, code)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the run's deadline still ends it at the gateway
        print(f"rsigym: could not end the run at the gateway ({err}); its deadline still will", file=sys.stderr,
              flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "supervise":
        print("usage: python -m ops.launcher supervise RUN_DIR", file=sys.stderr)
        return 2
    restrict_umask()  # its logs and the run's files are the gym's alone
    try:
        return asyncio.run(_supervise(Path(argv[1])))
    except asyncio.CancelledError:  # stopped: `run stop` records it
        return 143


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
