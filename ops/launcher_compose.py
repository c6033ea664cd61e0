"""Compose mode of the run launcher: the agent in its track's container, each run in a compose
project of its own whose one network no other run is on.

A run's project (``<project>-run-<run>``, its file ``<run-dir>/compose.yml``, written by
:func:`run_compose_file` from the gym's compose file) has three services on the run's own
**internal** network (``rsigym-run-<run>``: no route out, nobody else on it):

* ``agent`` — the track's agent image (``agent-<track>``'s image, build and hardening), on the run's
  network only;
* ``gym`` — the run's own path to the gateway: ``rsigym run-relay`` on the run's network and the
  core's ``agentnet`` (where the gateway is), relaying bytes to the gateway and nowhere else. The
  agent's ``RSIGYM_URL`` is this relay; another run's relay, agent or proxy is on no network the
  agent is on, so it has no address for them;
* ``egress`` (only when the task allows a host) — ``rsigym egress-proxy`` with the task's allowlist
  on the run's network and the core's ``egress`` network (the one with a route out). It also checks
  a per-run credential (``RSIGYM_EGRESS_TOKEN``; the agent has it in its proxy URL), so even a
  client that reached it some other way is refused (407).

Secrets (the run key, the proxy credential, the proxy URL that holds it) travel in the docker
CLI's environment (``-e NAME`` without a value), never on a command line or in the file.

Without a Docker engine here, the file is checked statically (tests/unit/ops/test_launcher_compose.py)
and its services are started as local processes by tests/fakes/docker_shim.py; what compose and
Docker themselves enforce (an internal network has no route, DNS answers only a network's members)
is not exercised here (docs/security.md).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kit.egress import proxy_env
from kit.errors import Unprocessable
from ops import run_watch

INSTRUCTION_INSIDE = "/run/rsigym/instruction.md"
SETUP_INSIDE = "/run/rsigym/setup"
"""A CLI's configuration files for its HOME (ops/agent_setup.py), mounted read-only; the image's
entrypoint copies them into HOME before the agent starts (the CLIs write beside them)."""
RELAY_PORT = 8700
EGRESS_PORT = 3128
HARDENING_KEYS = ("cap_drop", "security_opt", "user", "read_only")
"""What a per-run service keeps of the service it is made from, besides its image and build."""


@dataclass(frozen=True)
class ComposeTarget:
    """Where compose mode starts the agent: the operator's compose project (its core already up)."""

    file: Path
    project_dir: Path
    project: str = "rsigym"
    docker: str = "docker"


def names(run: str) -> dict[str, str]:
    """The run's compose project, network and container names (compose and Docker want lower case)."""
    slug = run.lower()
    return {"network": f"rsigym-run-{slug}", "agent": f"rsigym-agent-{slug}", "gym": f"rsigym-gym-{slug}",
            "egress": f"rsigym-egress-{slug}"}


def _made_from(source: dict[str, Any], project_dir: Path) -> dict[str, Any]:
    """A service's image, build (its context made absolute: the run's file lives elsewhere) and hardening."""
    out: dict[str, Any] = {"image": source["image"]}
    if build := source.get("build"):
        build = dict(build) if isinstance(build, dict) else {"context": build}
        build["context"] = str((project_dir / build.get("context", ".")).resolve())
        out["build"] = build
    out |= {k: source[k] for k in HARDENING_KEYS if k in source}
    return out


def _gateway_url(agent: dict[str, Any]) -> str:
    env = agent.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env if "=" in item)
    return str(env.get("RSIGYM_URL") or "http://gateway:8700")


def relay_url(run: str) -> str:
    """The agent's ``RSIGYM_URL`` in compose mode: the run's own relay to the gateway."""
    return f"http://{names(run)['gym']}:{RELAY_PORT}"


def run_compose_file(target: ComposeTarget, *, run: str, track: str, run_dir: Path, egress: bool,
                     env: dict[str, str] | None = None, setup: bool = False) -> dict[str, Any]:
    """The run's compose project (see the module's docstring), from the gym's compose file.
    ``env``: the agent template's own (non-secret) variables; ``setup``: mount ``<run-dir>/setup``."""
    try:
        gym_file = yaml.safe_load(target.file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise Unprocessable(f"cannot read the compose file {target.file}: {err}", param="compose_file") from None
    services = gym_file.get("services") or {}
    agent_source, proxy_source = services.get(f"agent-{track}"), services.get("egress")
    if agent_source is None or proxy_source is None:
        raise Unprocessable(f"{target.file} has no agent-{track} or egress service", param="compose_file")
    n = names(run)
    volumes = [f"{(run_dir / 'instruction.md').resolve()}:{INSTRUCTION_INSIDE}:ro"]
    if setup:
        volumes.append(f"{(run_dir / 'setup').resolve()}:{SETUP_INSIDE}:ro")
    agent = _made_from(agent_source, target.project_dir) | {
        "container_name": n["agent"],
        "environment": {**(env or {}), "RSIGYM_URL": relay_url(run), "RSIGYM_INSTRUCTION": INSTRUCTION_INSIDE},
        "volumes": volumes,
        "networks": ["run"],
        "restart": "no",
    }
    gym = _made_from(proxy_source, target.project_dir) | {
        "container_name": n["gym"],
        "command": ["run-relay", "--host", "0.0.0.0", "--port", str(RELAY_PORT), "--to", _gateway_url(agent_source)],
        "networks": ["run", "core"],
        "restart": "no",
    }
    spec: dict[str, Any] = {
        "name": f"{target.project}-run-{run.lower()}",
        "services": {"agent": agent, "gym": gym},
        "networks": {"run": {"name": n["network"], "internal": True},
                     "core": {"name": f"{target.project}_agentnet", "external": True}},
    }
    if egress:
        spec["services"]["egress"] = _made_from(proxy_source, target.project_dir) | {
            "container_name": n["egress"],
            "command": ["egress-proxy", "--host", "0.0.0.0", "--port", str(EGRESS_PORT)],
            "networks": ["run", "outside"],
            "restart": "no",
        }
        spec["networks"]["outside"] = {"name": f"{target.project}_egress", "external": True}
    return spec


def compose_plan(target: ComposeTarget, *, run: str, track: str, run_dir: Path, command: list[str],
                 egress: list[str], key: str, env: dict[str, str] | None = None,
                 setup: bool = False) -> dict[str, Any]:
    """Write the run's compose file and return the supervisor's plan: the ``docker compose run``
    lines (the relay and proxy detached, the agent in the foreground) and the docker CLI's
    environment, which alone holds the secrets."""
    spec = run_compose_file(target, run=run, track=track, run_dir=run_dir, egress=bool(egress), env=env,
                            setup=setup)
    path = run_dir / "compose.yml"
    path.write_text("# Written by `rsigym run start --mode compose` for this run only.\n" + yaml.safe_dump(spec))
    path.chmod(0o600)
    n = names(run)
    base = [target.docker, "compose", "-f", str(path), "--project-directory", str(target.project_dir),
            "-p", spec["name"], "run", "--rm"]
    docker_env: dict[str, str] = {"RSIGYM_API_KEY": key}
    detached = [[*base, "-d", "--name", n["gym"], "gym"]]
    agent = [*base, "-T", "--name", n["agent"], "-e", "RSIGYM_API_KEY"]
    if egress:
        token = secrets.token_urlsafe(24)
        docker_env |= {"RSIGYM_EGRESS_ALLOW": " ".join(egress), "RSIGYM_EGRESS_TOKEN": token}
        detached.append([*base, "-d", "--name", n["egress"], "-e", "RSIGYM_EGRESS_ALLOW", "-e", "RSIGYM_EGRESS_TOKEN",
                         "egress"])
        proxy = proxy_env(f"http://run:{token}@{n['egress']}:{EGRESS_PORT}", n["gym"])
        docker_env |= proxy
        agent += [a for name in proxy for a in ("-e", name)]
    return {"mode": "compose", "docker": target.docker, "network": n["network"], "env": docker_env,
            "detached": detached, "argv": [*agent, "agent", *command],
            "containers": [n["agent"], n["gym"], *([n["egress"]] if egress else [])]}


async def _docker(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> int:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, env=env)
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        proc.kill()
        return await proc.wait()


def remove_run(plan: dict[str, Any]) -> None:
    """Remove the run's containers and its network (``run stop``; the supervisor's own end does the same)."""
    subprocess.run([plan["docker"], "rm", "-f", *plan["containers"]], stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=120, check=False)
    subprocess.run([plan["docker"], "network", "rm", plan["network"]], stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=120, check=False)


class ContainerBox:
    """A compose run's agent container, as the supervisor freezes, thaws and stops it."""

    def __init__(self, docker: str, container: str, cli: asyncio.subprocess.Process):
        self.docker, self.container, self.cli = docker, container, cli

    async def freeze(self) -> None:
        await _docker(self.docker, "pause", self.container)

    async def thaw(self) -> None:
        await _docker(self.docker, "unpause", self.container)

    async def kill(self) -> None:
        await _docker(self.docker, "unpause", self.container)  # a paused container cannot be stopped
        await _docker(self.docker, "stop", "-t", "5", self.container)
        try:
            await asyncio.wait_for(self.cli.wait(), 30)
        except TimeoutError:
            self.cli.kill()
            await self.cli.wait()


async def supervise(plan: dict[str, Any], run: run_watch.RunAtGateway) -> run_watch.Outcome:
    """Start the run's relay (and proxy), then its agent, and follow the run at the gateway
    (ops/run_watch.py: ``docker pause`` while paused, the agent stopped at the wall clock or when
    the run ends there — the docker CLI's own exit does not stop a container); remove the run's
    containers and network at the end."""
    env = {**os.environ, **plan["env"]}
    docker, containers = plan["docker"], plan["containers"]
    try:
        for argv in plan["detached"]:
            if (code := await _docker(*argv, env=env, timeout=300)) != 0:
                print(f"rsigym: the run's {argv[-1]} container did not start (docker exit {code})", file=sys.stderr,
                      flush=True)
                return run_watch.Outcome(code)
        agent = await asyncio.create_subprocess_exec(*plan["argv"], stdin=subprocess.DEVNULL, env=env)
        await run.start()
        return await run_watch.follow(asyncio.ensure_future(agent.wait()), ContainerBox(docker, containers[0], agent),
                                      run, float(plan["seconds"]))
    finally:
        await _docker(docker, "rm", "-f", *containers)
        await _docker(docker, "network", "rm", plan["network"])
