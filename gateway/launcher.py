"""The run launcher, embedded mode (``rsigym run start|list|show|stop|logs``).

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field

from gateway.launcher_relay import _pipe  # the same byte pipe the in-namespace relay runs
from services.core.config import GymConfig, SandboxTemplate
from services.core.errors import Conflict, NotFound, ServiceUnavailable, Unprocessable

AGENTS = Path(__file__).with_name("agents.toml")
AGENT_FILES = Path(__file__).resolve().parents[1] / "agent_container" / "agents"
RELAY = Path(__file__).with_name("launcher_relay.py")
INSIDE_PORT = 8700
INSIDE_URL = f"http://127.0.0.1:{INSIDE_PORT}"
HOME_INSIDE = "/home/agent"
INSTRUCTION_INSIDE = "/run/rsigym/instruction.md"
SOCKET_INSIDE = "/run/rsigym/sock/gateway.sock"
PYTHON_INSIDE = "/usr/bin/python3"
"""The system interpreter (visible through the host dirs) that runs the relay inside."""


class AgentTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    command: list[str] = Field(min_length=1)
    """argv; ``{instruction}`` becomes the instruction's path inside."""
    binds: list[str] = Field(default_factory=list)
    """Extra host paths bound read-only at the same place (an operator-installed CLI)."""


class RunRecord(BaseModel):
    """``<data-dir>/runs/<run>/run.json``."""

    run: str
    key_id: str
    task: str
    agent: str
    pid: int
    started_at: str
    deadline_s: float
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


def agent_env(key: str) -> dict[str, str]:
    """Everything the agent's environment holds (and nothing else: bwrap --clearenv)."""
    return {"RSIGYM_URL": INSIDE_URL, "RSIGYM_API_KEY": key,
            "OPENAI_BASE_URL": f"{INSIDE_URL}/agent/v1", "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": f"{INSIDE_URL}/agent", "ANTHROPIC_API_KEY": key,
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME_INSIDE, "RSIGYM_INSTRUCTION": INSTRUCTION_INSIDE}


def bwrap_argv(bwrap: str, run_dir: Path, template: AgentTemplate, key: str, seconds: float,
               extra_args: list[str], host_dirs: list[str]) -> list[str]:
    argv = [bwrap, "--die-with-parent", "--unshare-all", "--unshare-net", "--new-session", "--clearenv"]
    for name, value in agent_env(key).items():
        argv += ["--setenv", name, value]
    for d in host_dirs:
        argv += ["--ro-bind-try", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--bind", str(run_dir / "home"), HOME_INSIDE,
             "--ro-bind", str(run_dir / "instruction.md"), INSTRUCTION_INSIDE,
             "--ro-bind", str((run_dir / "sock").resolve()), "/run/rsigym/sock",
             "--ro-bind", str(RELAY), "/run/rsigym/relay.py",
             "--ro-bind", str(AGENT_FILES), "/agent"]
    for path in template.binds:
        argv += ["--ro-bind", path, path]
    command = [part.replace("{instruction}", INSTRUCTION_INSIDE) for part in template.command] + extra_args
    return argv + ["--chdir", HOME_INSIDE, "--", PYTHON_INSIDE, "-I", "-S", "/run/rsigym/relay.py",
                   "--port", str(INSIDE_PORT), "--socket", SOCKET_INSIDE, "--seconds", str(seconds), "--", *command]


def _now() -> str:
    return datetime.now(UTC).isoformat()


def start_run(*, data_dir: Path, gateway_url: str, client: KeyMinter, task: Any, key_body: dict[str, Any],
              instruction: str, agent: str, config: GymConfig, extra_args: list[str] | None = None,
              agents_file: Path = AGENTS) -> RunRecord:
    """Mint the run key, lay out the run directory and start the supervisor; the run's record."""
    agents = load_agents(agents_file)
    if agent not in agents:
        raise Unprocessable(f"no agent {agent!r} (agents: {', '.join(sorted(agents)) or 'none'})", param="agent")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ServiceUnavailable("the embedded launcher needs bubblewrap (bwrap) on this host")
    minted = client.create_key(key_body)
    run = minted.get("run_id") or minted["id"]
    run_dir = runs_root(data_dir) / run
    (run_dir / "home").mkdir(parents=True, exist_ok=True)
    # AF_UNIX paths are short (108 bytes): the socket lives in a short private directory, linked here.
    sock_dir = Path(tempfile.mkdtemp(prefix="rsigym-run-"))
    (run_dir / "sock").symlink_to(sock_dir, target_is_directory=True)
    run_dir.chmod(0o700)
    (run_dir / "instruction.md").write_text(instruction)
    seconds = float(key_body.get("deadline_s") or task.limits.wall_clock_s)
    host_dirs = SandboxTemplate(name="agent").host_dirs
    argv = bwrap_argv(bwrap, run_dir, agents[agent], minted["key"], seconds, extra_args or [], host_dirs)
    plan = run_dir / "supervise.json"  # holds the run key: operator side only (0600, never bound inside)
    plan.write_text(json.dumps({"argv": argv, "gateway_url": gateway_url}))
    plan.chmod(0o600)
    with open(run_dir / "agent.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.launcher", "supervise", str(run_dir)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    record = RunRecord(run=run, key_id=minted["id"], task=task.name, agent=agent, pid=proc.pid,
                       started_at=_now(), deadline_s=seconds)
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
    """Kill the run's processes and end the run at the gateway (its deadline set to now)."""
    record = show_run(data_dir, run)
    if record.status == "running":
        try:
            os.killpg(record.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        record = record.model_copy(update={"status": "stopped", "ended_at": _now()})
        _write(runs_root(data_dir) / run, record)
    elif record.status == "stopped":
        raise Conflict(f"run {run} is already stopped", param="run")
    client.set_deadline(record.key_id, 0)
    return record


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


async def _supervise(run_dir: Path) -> int:
    plan = json.loads((run_dir / "supervise.json").read_text())
    url = httpx.URL(plan["gateway_url"])
    host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
    sock = (run_dir / "sock").resolve() / "gateway.sock"
    if sock.exists():
        sock.unlink()
    server = await asyncio.start_unix_server(lambda r, w: _relay(r, w, host, port), str(sock))
    sock.chmod(0o600)
    async with server:
        agent = await asyncio.create_subprocess_exec(*plan["argv"], stdin=subprocess.DEVNULL)
        code = await agent.wait()
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
