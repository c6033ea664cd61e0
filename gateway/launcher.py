"""The run launcher (``rsigym run start|list|show|stop|logs``): embedded mode below; compose mode
(:func:`compose_plan`) runs the agent in its track's container with ``docker compose run`` and the
same supervisor stops it at the wall clock. A task's egress allowlist is served by gateway/egress.py
(embedded: on a socket the in-namespace relay exposes at 127.0.0.1:8701; compose: a per-run
``egress`` container).

``start`` mints the run key through the admin API (the task's key body), renders the instruction
into ``<data-dir>/runs/<run>/`` and starts a detached *supervisor* (``python -m gateway.launcher
supervise DIR``, its own session) which:

* serves ``DIR/sock/gateway.sock``, relaying every connection to the gateway's host and port;
* starts the agent under bubblewrap with every namespace unshared (network included), only the
  host's system directories read-only (the sandbox templates' ``host_dirs``), a fresh HOME, the
  instruction, the agent's files and the socket directory bound — the data dir, the store, provider
  keys and the admin token are not there;
* inside, gateway/launcher_relay.py listens on 127.0.0.1:8700 (the agent's ``RSIGYM_URL``) and
  relays to that socket: the agent's only network reach is the gateway. It kills the agent when
  the task's wall clock passes (the gateway refuses the run key after its deadline regardless);
* records the exit in ``run.json``.

``stop`` kills the supervisor's process group and ends the run (deadline now, admin route).
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
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field

from gateway.egress import HEAD_LIMIT, EgressPolicy, EgressProxy
from gateway.launcher_relay import _pipe  # the same byte pipe the in-namespace relay runs
from services.core.config import GymConfig, SandboxTemplate
from services.core.errors import Conflict, NotFound, ServiceUnavailable, Unprocessable

AGENTS = Path(__file__).with_name("agents.toml")
AGENT_FILES = Path(__file__).resolve().parents[1] / "agent_container" / "agents"
HARNESS_FILES = AGENT_FILES.parent / "harness"
HARNESS_INSIDE = "/opt/rsigym/harness"
"""The harnesses' source (``minimal``: the starting point of an agent's own), read-only; the agent image
has it at the same path."""
RELAY = Path(__file__).with_name("launcher_relay.py")
INSIDE_PORT = 8700
INSIDE_URL = f"http://127.0.0.1:{INSIDE_PORT}"
EGRESS_PORT = 8701
"""Inside, the egress proxy's address (only when the task allows a host): ``HTTPS_PROXY``."""
HOME_INSIDE = "/home/agent"
INSTRUCTION_INSIDE = "/run/rsigym/instruction.md"
SOCKET_INSIDE = "/run/rsigym/sock/gateway.sock"
EGRESS_SOCKET_INSIDE = "/run/rsigym/sock/egress.sock"
PYTHON_INSIDE = "/usr/bin/python3"
"""The system interpreter (visible through the host dirs) that runs the relay inside."""


class AgentTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    command: list[str] = Field(min_length=1)
    """argv; ``{instruction}`` becomes the instruction's path inside."""
    binds: list[str] = Field(default_factory=list)
    """Extra host paths bound read-only at the same place (an operator-installed CLI)."""
    compose_command: list[str] | None = None
    """argv in compose mode (the agent image's paths), when it differs from ``command``."""


class RunRecord(BaseModel):
    """``<data-dir>/runs/<run>/run.json``."""

    run: str
    key_id: str
    task: str
    agent: str
    pid: int
    started_at: str
    deadline_s: float
    mode: str = "embedded"
    """embedded (bubblewrap on this host) or compose (the track's agent container)."""
    egress: list[str] = Field(default_factory=list)
    """The task's egress allowlist (hosts the agent reaches through the egress proxy)."""
    status: str = "running"
    """running, exited, stopped."""
    exit_code: int | None = None
    ended_at: str | None = None


class KeyMinter(Protocol):
    def create_key(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def set_deadline(self, key_id: str, deadline_s: float) -> dict[str, Any]: ...


def load_agents(path: Path = AGENTS) -> dict[str, AgentTemplate]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise Unprocessable(f"cannot read the agents registry {path}: {err}", param="agent") from None
    return {name: AgentTemplate.model_validate(raw) for name, raw in (data.get("agents") or {}).items()}


def runs_root(data_dir: Path) -> Path:
    return Path(data_dir) / "runs"


def proxy_env(proxy_url: str, gateway_host: str) -> dict[str, str]:
    """What points pip, curl, httpx, requests and urllib at the egress proxy (both spellings:
    curl reads only the lower-case ``http_proxy``)."""
    no_proxy = f"{gateway_host},localhost,127.0.0.1"
    return {"HTTPS_PROXY": proxy_url, "HTTP_PROXY": proxy_url, "https_proxy": proxy_url, "http_proxy": proxy_url,
            "NO_PROXY": no_proxy, "no_proxy": no_proxy}


def agent_env(key: str, egress: bool = False) -> dict[str, str]:
    """Everything the agent's environment holds (and nothing else: bwrap --clearenv)."""
    env = {"RSIGYM_URL": INSIDE_URL, "RSIGYM_API_KEY": key,
           "OPENAI_BASE_URL": f"{INSIDE_URL}/agent/v1", "OPENAI_API_KEY": key,
           "ANTHROPIC_BASE_URL": f"{INSIDE_URL}/agent", "ANTHROPIC_API_KEY": key,
           "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME_INSIDE, "RSIGYM_INSTRUCTION": INSTRUCTION_INSIDE}
    if egress:
        env |= proxy_env(f"http://127.0.0.1:{EGRESS_PORT}", "127.0.0.1")
    return env


def bwrap_argv(bwrap: str, run_dir: Path, template: AgentTemplate, key: str, seconds: float,
               extra_args: list[str], host_dirs: list[str], egress: bool = False) -> list[str]:
    argv = [bwrap, "--die-with-parent", "--unshare-all", "--unshare-net", "--new-session", "--clearenv"]
    for name, value in agent_env(key, egress).items():
        argv += ["--setenv", name, value]
    for d in host_dirs:
        argv += ["--ro-bind-try", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--bind", str(run_dir / "home"), HOME_INSIDE,
             "--ro-bind", str(run_dir / "instruction.md"), INSTRUCTION_INSIDE,
             "--ro-bind", str((run_dir / "sock").resolve()), "/run/rsigym/sock",
             "--ro-bind", str(RELAY), "/run/rsigym/relay.py",
             "--ro-bind", str(AGENT_FILES), "/agent",
             "--ro-bind", str(HARNESS_FILES), HARNESS_INSIDE]
    for path in template.binds:
        argv += ["--ro-bind", path, path]
    command = [part.replace("{instruction}", INSTRUCTION_INSIDE) for part in template.command] + extra_args
    relay = ["--port", str(INSIDE_PORT), "--socket", SOCKET_INSIDE, "--seconds", str(seconds)]
    if egress:
        relay += ["--egress-port", str(EGRESS_PORT), "--egress-socket", EGRESS_SOCKET_INSIDE]
    return argv + ["--chdir", HOME_INSIDE, "--", PYTHON_INSIDE, "-I", "-S", "/run/rsigym/relay.py", *relay,
                   "--", *command]


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class ComposeTarget:
    """Where compose mode starts the agent: the operator's compose project (its core already up)."""

    file: Path
    project_dir: Path
    project: str = "rsigym"
    docker: str = "docker"


def _compose(target: ComposeTarget, track: str) -> list[str]:
    return [target.docker, "compose", "-f", str(target.file), "--project-directory", str(target.project_dir),
            "-p", target.project, "--profile", track]


def compose_plan(target: ComposeTarget, *, run: str, track: str, run_dir: Path, template: AgentTemplate,
                 extra_args: list[str], egress: list[str]) -> dict[str, Any]:
    """The ``docker compose run`` lines of a compose-mode run: the agent in its track's container
    (``agent-<track>``: agentnet only, so the gateway is its one peer) and, when the task allows any
    host, a per-run ``egress`` proxy container with the task's allowlist. The run key travels in the
    docker CLI's environment (``-e NAME`` without a value), never on a command line."""
    agent_name, egress_name = f"rsigym-agent-{run}", f"rsigym-egress-{run}"
    command = [part.replace("{instruction}", INSTRUCTION_INSIDE)
               for part in (template.compose_command or template.command)] + extra_args
    agent = [*_compose(target, track), "run", "--rm", "-T", "--name", agent_name,
             "-e", "RSIGYM_API_KEY", "-e", f"RSIGYM_INSTRUCTION={INSTRUCTION_INSIDE}",
             "-v", f"{(run_dir / 'instruction.md').resolve()}:{INSTRUCTION_INSIDE}:ro"]
    plan: dict[str, Any] = {"mode": "compose", "containers": [agent_name], "docker": target.docker}
    if egress:
        plan["egress_argv"] = [*_compose(target, track), "--profile", "egress", "run", "--rm", "-d",
                               "--name", egress_name, "-e", "RSIGYM_EGRESS_ALLOW", "egress"]
        plan["containers"].append(egress_name)
        for name, value in proxy_env(f"http://{egress_name}:3128", "gateway").items():
            agent += ["-e", f"{name}={value}"]
    plan["argv"] = [*agent, f"agent-{track}", *command]
    return plan


def start_run(*, data_dir: Path, gateway_url: str, client: KeyMinter, task: Any, key_body: dict[str, Any],
              instruction: str, agent: str, config: GymConfig, extra_args: list[str] | None = None,
              agents_file: Path = AGENTS, compose: ComposeTarget | None = None) -> RunRecord:
    """Mint the run key, lay out the run directory and start the supervisor; the run's record.
    ``compose`` set: compose mode (the track's agent container), else embedded (bubblewrap here)."""
    agents = load_agents(agents_file)
    if agent not in agents:
        raise Unprocessable(f"no agent {agent!r} (agents: {', '.join(sorted(agents)) or 'none'})", param="agent")
    egress = list(getattr(getattr(task, "egress", None), "allow", []) or [])
    bwrap = shutil.which("bwrap")
    if compose is None and bwrap is None:
        raise ServiceUnavailable("the embedded launcher needs bubblewrap (bwrap) on this host")
    if compose is not None and shutil.which(compose.docker) is None:
        raise ServiceUnavailable(f"compose mode needs the docker CLI ({compose.docker!r} is not on PATH)")
    minted = client.create_key(key_body)
    run = minted.get("run_id") or minted["id"]
    run_dir = runs_root(data_dir) / run
    (run_dir / "home").mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o700)
    (run_dir / "instruction.md").write_text(instruction)
    seconds = float(key_body.get("deadline_s") or task.limits.wall_clock_s)
    plan: dict[str, Any]
    if compose is not None:
        (run_dir / "instruction.md").chmod(0o644)  # read by the container's non-root user
        plan = compose_plan(compose, run=run, track=task.task.track, run_dir=run_dir, template=agents[agent],
                            extra_args=extra_args or [], egress=egress)
        plan |= {"key": minted["key"], "egress": egress}
    else:
        # AF_UNIX paths are short (108 bytes): the sockets live in a short private directory, linked here.
        sock_dir = Path(tempfile.mkdtemp(prefix="rsigym-run-"))
        (run_dir / "sock").symlink_to(sock_dir, target_is_directory=True)
        host_dirs = SandboxTemplate(name="agent").host_dirs
        argv = bwrap_argv(str(bwrap), run_dir, agents[agent], minted["key"], seconds, extra_args or [], host_dirs,
                          egress=bool(egress))
        plan = {"mode": "embedded", "argv": argv, "gateway_url": gateway_url, "egress": egress}
    plan["seconds"] = seconds
    path = run_dir / "supervise.json"  # holds the run key: operator side only (0600, never bound inside)
    path.write_text(json.dumps(plan))
    path.chmod(0o600)
    with open(run_dir / "agent.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.launcher", "supervise", str(run_dir)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    record = RunRecord(run=run, key_id=minted["id"], task=task.name, agent=agent, pid=proc.pid,
                       started_at=_now(), deadline_s=seconds, mode=plan["mode"], egress=egress)
    _write(run_dir, record)
    return record


def _write(run_dir: Path, record: RunRecord) -> None:
    tmp = run_dir / "run.json.tmp"
    tmp.write_text(record.model_dump_json(indent=2))
    tmp.replace(run_dir / "run.json")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (an unreaped child of a long-lived caller) is not running
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def show_run(data_dir: Path, run: str) -> RunRecord:
    path = runs_root(data_dir) / run / "run.json"
    if "/" in run or run.startswith(".") or not path.is_file():
        raise NotFound(f"no run {run!r} in {runs_root(data_dir)}", param="run")
    record = RunRecord.model_validate_json(path.read_text())
    if record.status == "running" and not _alive(record.pid):
        record = record.model_copy(update={"status": "exited"})  # the supervisor died without recording it
    return record


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
        try:
            os.killpg(record.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        record = record.model_copy(update={"status": "stopped", "ended_at": _now()})
        _write(run_dir, record)
    elif record.status == "stopped":
        raise Conflict(f"run {run} is already stopped", param="run")
    if record.mode == "compose":
        plan = json.loads((run_dir / "supervise.json").read_text())
        subprocess.run([plan["docker"], "rm", "-f", *plan["containers"]], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=120, check=False)
    _cleanup(run_dir)
    client.set_deadline(record.key_id, 0)
    return record


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


async def _supervise_embedded(run_dir: Path, plan: dict[str, Any]) -> int:
    url = httpx.URL(plan["gateway_url"])
    host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
    sock_dir = (run_dir / "sock").resolve()
    servers = [await asyncio.start_unix_server(lambda r, w: _relay(r, w, host, port), str(sock_dir / "gateway.sock"))]
    if plan.get("egress"):
        proxy = EgressProxy(EgressPolicy(plan["egress"]), log=run_dir / "egress.log")
        servers.append(await asyncio.start_unix_server(proxy.handle, str(sock_dir / "egress.sock"), limit=HEAD_LIMIT))
    for name in ("gateway.sock", "egress.sock"):
        if (sock_dir / name).exists():
            (sock_dir / name).chmod(0o600)
    try:
        agent = await asyncio.create_subprocess_exec(*plan["argv"], stdin=subprocess.DEVNULL)
        return await agent.wait()  # the in-namespace relay kills the agent at the wall clock (exit 124)
    finally:
        for server in servers:
            server.close()


async def _docker(*argv: str) -> int:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL)
    try:
        return await asyncio.wait_for(proc.wait(), 120)
    except TimeoutError:
        proc.kill()
        return await proc.wait()


async def _supervise_compose(plan: dict[str, Any]) -> int:
    """Start the run's containers with ``docker compose run``; at the wall clock stop them (the
    docker CLI's own exit does not stop a container); remove them at the end."""
    env = {**os.environ, "RSIGYM_API_KEY": plan["key"], "RSIGYM_EGRESS_ALLOW": " ".join(plan.get("egress") or [])}
    docker, containers = plan["docker"], plan["containers"]
    try:
        if plan.get("egress_argv"):
            started = await asyncio.create_subprocess_exec(*plan["egress_argv"], stdin=subprocess.DEVNULL, env=env)
            if (code := await asyncio.wait_for(started.wait(), 300)) != 0:
                print(f"rsigym: the run's egress proxy did not start (docker exit {code})", file=sys.stderr, flush=True)
                return code
        agent = await asyncio.create_subprocess_exec(*plan["argv"], stdin=subprocess.DEVNULL, env=env)
        try:
            return await asyncio.wait_for(agent.wait(), timeout=max(float(plan["seconds"]), 0.0))
        except TimeoutError:
            print("rsigym: the run's wall clock has passed; the agent is stopped", file=sys.stderr, flush=True)
            await _docker(docker, "stop", "-t", "5", containers[0])
            try:
                await asyncio.wait_for(agent.wait(), 30)
            except TimeoutError:
                agent.kill()
                await agent.wait()
            return 124
    finally:
        await _docker(docker, "rm", "-f", *containers)


async def _supervise(run_dir: Path) -> int:
    plan = json.loads((run_dir / "supervise.json").read_text())
    try:
        if plan["mode"] == "compose":
            code = await _supervise_compose(plan)
        else:
            code = await _supervise_embedded(run_dir, plan)
    finally:
        _cleanup(run_dir)
    path = run_dir / "run.json"
    record = RunRecord.model_validate_json(path.read_text())
    if record.status == "running":
        _write(run_dir, record.model_copy(update={"status": "exited", "exit_code": code, "ended_at": _now()}))
    return code


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "supervise":
        print("usage: python -m gateway.launcher supervise RUN_DIR", file=sys.stderr)
        return 2
    return asyncio.run(_supervise(Path(argv[1])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
