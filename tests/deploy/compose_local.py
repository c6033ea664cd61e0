"""docker-compose.yml read and launched without a Docker engine.

The first half reads the deployment files (compose services, their environment, commands and
volumes; deploy/Dockerfile's stages, ENV, ENTRYPOINT) and is shared by the static checks
(tests/deploy/test_deploy_static.py). The second half, :class:`LocalCompose`, starts what one compose
profile activates as local processes: each part with the entrypoint its image declares, the
command compose gives it (or its image's CMD) and exactly the environment compose and the image
give it, with compose's interpolation filled from a ``.env`` as .env.example asks. What a
container engine would provide is mapped, and only that:

* service host names (``http://gateway:8700``) → 127.0.0.1 on a free port per service;
* named volumes → directories under the test's tmp dir (shared by every part that mounts them),
  bind mounts → the repository files, container paths in the environment → those directories;
* the ``postgres`` and ``redis`` services → the test PostgreSQL schema and the test Redis database
  (every ``postgresql://…`` / ``redis://…`` value is replaced by them).

Nothing else of the environment is inherited from the test process: a part that works here
gets everything it needs from compose and its image.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
VENV_BIN = Path(sys.executable).parent
"""Where the project's console scripts (``rsigym``, ``gym``) and Python are installed here."""

_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")
_HOST_URL = re.compile(r"\b(?P<scheme>https?)://(?P<host>[a-z][a-z0-9-]*):(?P<port>\d+)")


# ---- compose, read -------------------------------------------------------------------------------


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def with_defaults(value: str) -> str:
    """Compose interpolation as an unconfigured checkout sees it: ``${X:-d}`` → ``d``, others → ``<X>``."""
    return _VAR.sub(lambda m: m["arg"] if m["op"] in (":-", "-") else f"<{m['name']}>", value)


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${X}``, ``${X:-d}``, ``${X:?msg}`` against ``env`` (``.env``), refusing a missing
    required variable as compose does."""
    def one(m: re.Match[str]) -> str:
        if m["name"] in env and (env[m["name"]] or m["op"] not in (":-", ":?")):
            return env[m["name"]]
        if m["op"] in (":?", "?"):
            raise AssertionError(f"compose would refuse to start: {m['name']} is required ({m['arg']})")
        return m["arg"] or ""
    return _VAR.sub(one, value)


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def networks_of(service: dict[str, Any]) -> set[str]:
    nets = service.get("networks")
    if nets is None:
        return {"default"}
    return set(nets)


def command_of(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]


def option(cmd: list[str], name: str) -> list[str]:
    return [cmd[i + 1] for i, part in enumerate(cmd[:-1]) if part == name]


def dockerfile_of(service: dict[str, Any]) -> str | None:
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        return "Dockerfile"
    return build.get("dockerfile", "Dockerfile")


def target_of(service: dict[str, Any]) -> str | None:
    build = service.get("build")
    return build.get("target") if isinstance(build, dict) else None


def active_in(service: dict[str, Any], profile: str) -> bool:
    profiles = service.get("profiles")
    return not profiles or profile in profiles


def profiles_of(services: dict[str, dict[str, Any]]) -> list[str]:
    """Every profile some service of the compose file names, in first-seen order."""
    seen: dict[str, None] = {}
    for svc in services.values():
        for profile in svc.get("profiles") or []:
            seen.setdefault(str(profile))
    return list(seen)


def listen_port(service: dict[str, Any]) -> int:
    ports = option(command_of(service), "--port")
    return int(ports[-1]) if ports else 8700


# ---- Dockerfiles, read ---------------------------------------------------------------------------


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path}: dangling line continuation"
    return out


def dockerfile_stages(path: Path) -> dict[str, dict[str, Any]]:
    """Build stages by name: ``{"base": FROM's image or stage, "steps": [(INSTR, args), …]}``."""
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for word, args in dockerfile_instructions(path):
        if word == "FROM":
            parts = args.split()
            name = parts[parts.index("AS") + 1] if "AS" in parts else f"#{len(stages)}"
            current = stages[name] = {"base": parts[0], "steps": []}
        elif current is not None:
            current["steps"].append((word, args))
    return stages


def stage_chain(stages: dict[str, dict[str, Any]], name: str) -> list[str]:
    """``name`` and the stages it builds FROM, nearest first."""
    chain = [name]
    while stages[chain[-1]]["base"] in stages:
        chain.append(stages[chain[-1]]["base"])
    return chain


def effective(stages: dict[str, dict[str, Any]], name: str, instruction: str) -> str | None:
    """The last ``instruction`` (USER, ENTRYPOINT, CMD, HEALTHCHECK, WORKDIR) in effect for a target."""
    for stage in stage_chain(stages, name):
        found = [a for w, a in stages[stage]["steps"] if w == instruction]
        if found:
            return found[-1]
    return None


def _exec_form(args: str) -> list[str]:
    return [str(p) for p in json.loads(args)] if args.startswith("[") else ["/bin/sh", "-c", args]


def _env_pairs(args: str) -> list[tuple[str, str]]:
    """``ENV A=1 B="x y"`` (and the legacy ``ENV A 1``)."""
    parts = shlex.split(args)
    if parts and "=" not in parts[0]:
        return [(parts[0], " ".join(parts[1:]))]
    return [tuple(p.split("=", 1)) for p in parts]  # type: ignore[misc]


class Image:
    """What one build target of a Dockerfile gives its containers: ENV, WORKDIR, ENTRYPOINT, CMD
    and where COPY put repository files."""

    def __init__(self, dockerfile: Path, target: str | None):
        stages = dockerfile_stages(dockerfile)
        name = target or list(stages)[-1]
        chain = list(reversed(stage_chain(stages, name)))  # farthest first: later ENV wins
        self.env: dict[str, str] = {}
        self.copied: dict[str, str] = {}
        for stage in chain:
            for word, args in stages[stage]["steps"]:
                if word == "ENV":
                    for key, value in _env_pairs(args):
                        self.env[key] = value.replace("$PATH", "").rstrip(":") if key == "PATH" else value
                elif word == "COPY" and "--from" not in args:
                    parts = [p for p in shlex.split(args) if not p.startswith("--")]
                    for source in parts[:-1]:
                        self.copied[parts[-1]] = source
        entry = effective(stages, name, "ENTRYPOINT")
        cmd = effective(stages, name, "CMD")
        self.entrypoint = _exec_form(entry) if entry else []
        self.cmd = _exec_form(cmd) if cmd else []
        self.workdir = effective(stages, name, "WORKDIR") or "/"


# ---- compose, launched ---------------------------------------------------------------------------


class LocalCompose:
    """One compose profile as local processes (see the module's docstring for the mapping)."""

    def __init__(self, profile: str, tmp: Path, dotenv: dict[str, str], *, store_url: str, redis_url: str,
                 extra_env: dict[str, str] | None = None):
        self.profile, self.tmp, self.dotenv = profile, tmp, dotenv
        self.store_url, self.redis_url = store_url, redis_url
        self.extra_env = extra_env or {}
        """Test-only isolation variables given to every rsigym part (e.g. a queue prefix in a shared Redis)."""
        self.services = {n: s for n, s in load_compose()["services"].items() if active_in(s, profile)}
        self.ports = {name: _free_port() for name in self.services}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.envs: dict[str, dict[str, str]] = {}
        self.logs = tmp / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    # -- the mapping ------------------------------------------------------------------------------

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def mounts(self, name: str) -> dict[str, Path]:
        """Container path → local path of every volume of ``name`` (named volumes under tmp/volumes)."""
        out: dict[str, Path] = {}
        for spec in self.services[name].get("volumes") or []:
            source, target, *_ = interpolate(str(spec), self.dotenv).split(":")
            if source.startswith((".", "/")):
                out[target] = (ROOT / source).resolve()
            else:
                out[target] = self.tmp / "volumes" / source
                out[target].mkdir(parents=True, exist_ok=True)
        return out

    def host_path(self, name: str, container_path: str) -> Path:
        """Where a container path of ``name`` lies here: in a mounted volume, or in its own filesystem."""
        mounts = self.mounts(name)
        for target in sorted(mounts, key=len, reverse=True):
            if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
                return mounts[target] / container_path[len(target):].lstrip("/")
        return self.tmp / "containers" / name / container_path.lstrip("/")

    def local_value(self, name: str, value: str) -> str:
        """An interpolated environment value of ``name``, mapped to this machine."""
        if value.startswith(("postgresql://", "postgres://")):
            return self.store_url
        if value.startswith("redis://"):
            return self.redis_url

        def host(m: re.Match[str]) -> str:
            target = m["host"]
            assert target in self.services, f"{name}: {m[0]} names {target}, which profile {self.profile} does not start"
            return f"{m['scheme']}://127.0.0.1:{self.ports[target]}"
        value = _HOST_URL.sub(host, value)
        if value.startswith("/") and " " not in value:
            path = self.host_path(name, value)
            path.parent.mkdir(parents=True, exist_ok=True)
            return str(path)
        return value

    def image(self, name: str) -> Image:
        svc = self.services[name]
        dockerfile = dockerfile_of(svc)
        assert dockerfile, f"{name} has no build: {svc.get('image')} is not launched as a local process"
        return Image(ROOT / dockerfile, target_of(svc))

    def environment(self, name: str) -> dict[str, str]:
        """Exactly what compose and the image give the container, mapped (no variable of the test process)."""
        image = self.image(name)
        env = {k: self.local_value(name, v) for k, v in image.env.items() if k != "PATH"}
        for key, value in env_of(self.services[name]).items():
            env[key] = self.local_value(name, interpolate(value, self.dotenv))
        if "RSIGYM_HEALTH_PORT" in env:
            env["RSIGYM_HEALTH_PORT"] = str(self.ports[name])
        home = self.tmp / "containers" / name / "home"
        home.mkdir(parents=True, exist_ok=True)
        # A container has a PATH with its interpreter and tools (here: the venv's) and a HOME.
        env.update(PATH=f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", HOME=str(home), OMP_NUM_THREADS="1")
        return env

    def argv(self, name: str, command: list[str] | None = None) -> list[str]:
        """The image's ENTRYPOINT (mapped to the installed script or the copied repository file) with
        compose's command (or ``command``, as ``docker compose run <name> …`` would), mapped."""
        image = self.image(name)
        cmd = command if command is not None else (command_of(self.services[name]) or image.cmd)
        cmd = [self.local_value(name, interpolate(part, self.dotenv)) for part in cmd]
        if "--port" in cmd:
            cmd[cmd.index("--port") + 1] = str(self.ports[name])
        if "--host" in cmd:
            cmd[cmd.index("--host") + 1] = "127.0.0.1"  # not every interface of the test machine
        entry: list[str] = []
        for part in image.entrypoint:
            if part in image.copied:
                entry.append(str(ROOT / image.copied[part]))
            elif "/" not in part and (VENV_BIN / part).exists():
                entry.append(str(VENV_BIN / part))
            else:
                entry.append(part)
        return entry + cmd

    # -- processes --------------------------------------------------------------------------------

    def start(self, name: str, command: list[str] | None = None, *, as_name: str | None = None) -> subprocess.Popen[bytes]:
        label = as_name or name
        env = self.environment(name)
        if dockerfile_of(self.services[name]) == "deploy/Dockerfile":
            env.update(self.extra_env)
        workdir = self.host_path(name, self.image(name).workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.envs[label] = env
        out = open(self.logs / f"{label}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[label] = subprocess.Popen(self.argv(name, command), cwd=workdir, env=env, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return self.procs[label]

    def start_raw(self, label: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A part that is not built from this repository (Prometheus from its Debian package)."""
        out = open(self.logs / f"{label}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[label] = subprocess.Popen(argv, cwd=self.tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        out.close()
        return self.procs[label]

    def log(self, label: str) -> str:
        return (self.logs / f"{label}.log").read_text(errors="replace")[-4000:]

    def until(self, what: str, check: Callable[[], Any], timeout: float = 300, poll: float = 0.5,
              watch: tuple[str, ...] = ()) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for label in watch:
                proc = self.procs[label]
                assert proc.poll() is None, f"{label} exited ({proc.returncode}):\n{self.log(label)}"
            value = check()
            if value:
                return value
            time.sleep(poll)
        raise AssertionError(f"{what}: not within {timeout} s\n" + "\n".join(f"--- {w}\n{self.log(w)}" for w in watch))

    def healthz(self, name: str, timeout: float = 300) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            try:
                response = httpx.get(f"{self.url(name)}/healthz", timeout=2)
            except httpx.HTTPError:
                return None
            return response.json() if response.status_code == 200 else None
        return self.until(f"{name} /healthz", probe, timeout=timeout, watch=(name,))

    def wait(self, label: str, timeout: float = 120) -> int:
        return self.procs[label].wait(timeout=timeout)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _free_port() -> int:
    from tests.fakes.servers import free_port

    return free_port()
