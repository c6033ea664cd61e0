"""A stand-in for the ``docker`` CLI where no Docker engine runs: ``docker compose ... run`` starts,
as a local process, exactly what the compose file declares for the service (its image's
entrypoint and command from the Dockerfile, its environment interpolated as compose does, ``-e``
and ``-v`` applied), with the compose host names mapped to loopback ports; ``docker stop`` and
``docker rm -f`` end it; ``docker pause``/``unpause`` stop and continue its processes. It refuses
what compose would refuse: a service the given profiles do not activate, an option it does not know.

Used as ``docker`` on PATH by tests/e2e/test_launcher.py to prove compose mode's wiring. Its state
lives in ``$SHIM_STATE`` (one JSON file per named container: pid, published address); ``$SHIM_HOSTS``
maps ``host:port`` (compose service names) to ``127.0.0.1:port``; ``$SHIM_PYTHON`` is the
interpreter standing in for the images' ``python3`` (its directory goes first on PATH).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

_VAR = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        if m["name"] in env and (env[m["name"]] or m["op"] not in (":-", ":?")):
            return env[m["name"]]
        if m["op"] in (":?", "?"):
            sys.exit(f"compose: required variable {m['name']} is missing a value: {m['arg']}")
        return m["arg"] or ""
    return _VAR.sub(one, value)


def _state() -> Path:
    path = Path(os.environ["SHIM_STATE"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def _hosts() -> dict[str, str]:
    hosts = json.loads(os.environ.get("SHIM_HOSTS", "{}"))
    for f in _state().glob("*.json"):
        entry = json.loads(f.read_text())
        if entry.get("published"):
            hosts[f"{f.stem}:{entry['port']}"] = entry["published"]
    return hosts


def _map_hosts(value: str) -> str:
    for name, local in _hosts().items():  # a URL's host, with or without credentials before it
        value = value.replace(f"//{name}", f"//{local}").replace(f"@{name}", f"@{local}")
    return value


def _image(root: Path, service: dict[str, Any]) -> tuple[list[str], list[str], dict[str, str]]:
    """(entrypoint, cmd, container path -> repo path) of the service's build target."""
    build = service.get("build") or {}
    dockerfile = (root / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).read_text()
    stages: dict[str, list[str]] = {}
    parents: dict[str, str | None] = {}
    current = ""
    for line in dockerfile.splitlines():
        if m := re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I):
            current = m[2] or f"#{len(stages)}"
            parents[current] = m[1] if m[1] in stages else None
            stages[current] = []
        elif line and not line.startswith("#") and current:
            stages[current].append(line)
    chain: list[str] = []
    stage: str | None = build.get("target") or current
    while stage is not None:
        chain.insert(0, stage)
        stage = parents.get(stage)
    entrypoint: list[str] = []
    cmd: list[str] = []
    paths: dict[str, str] = {}
    for name in chain:
        for line in stages[name]:
            word, _, rest = line.partition(" ")
            if word == "ENTRYPOINT":
                entrypoint = json.loads(rest)
            elif word == "CMD":
                cmd = json.loads(rest)
            elif word == "COPY" and not rest.startswith("--from"):
                *sources, dest = shlex.split(rest)
                for src in sources:
                    paths[dest.rstrip("/") if len(sources) == 1 else f"{dest.rstrip('/')}/{Path(src).name}"] = \
                        str(root / build.get("context", ".") / src)
    return entrypoint, cmd, paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compose_run(argv: list[str]) -> int:  # noqa: C901 - a fake's command dispatcher
    files, profiles, project_dir = [], [], None
    i = 0
    while i < len(argv) and argv[i] != "run":
        flag = argv[i]
        if flag in ("-f", "--file"):
            files.append(argv[i + 1])
        elif flag == "--profile":
            profiles.append(argv[i + 1])
        elif flag == "--project-directory":
            project_dir = argv[i + 1]
        elif flag not in ("-p", "--project-name"):
            sys.exit(f"compose: unknown flag {flag}")
        i += 2
    if i == len(argv):
        sys.exit("compose: only `run` is supported by this shim")
    args = argv[i + 1:]
    detach = remove = False
    name, env_args, volumes = None, [], []
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "--rm":
            remove = True
        elif flag == "-d":
            detach = True
        elif flag == "-T":
            pass
        elif flag == "--name":
            name = args.pop(0)
        elif flag == "-e":
            env_args.append(args.pop(0))
        elif flag == "-v":
            volumes.append(args.pop(0))
        else:
            sys.exit(f"compose run: unknown option {flag}")
    service_name, command = args[0], args[1:]
    compose_file = Path(files[0]) if files else Path("docker-compose.yml")
    root = Path(project_dir) if project_dir else compose_file.parent
    spec = yaml.safe_load(compose_file.read_text())
    service = (spec.get("services") or {}).get(service_name)
    if service is None:
        sys.exit(f"compose: no such service: {service_name}")
    if service.get("profiles") and not set(service["profiles"]) & set(profiles):
        sys.exit(f"compose: service {service_name} is not enabled by the active profiles {profiles}")
    dotenv: dict[str, str] = {}
    if (root / ".env").is_file():
        for line in (root / ".env").read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.startswith("#"):
                dotenv[key.strip()] = value.strip()
    shell_env = {**dotenv, **os.environ}
    env: dict[str, str] = {}
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    for key, value in environment.items():
        env[key] = interpolate(str(value), shell_env)
    for item in env_args:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
    entrypoint, image_cmd, paths = _image(root, service)
    for volume in [*(v for v in service.get("volumes") or [] if isinstance(v, str)), *volumes]:
        src, dst, *_ = volume.split(":")
        if src.startswith("/"):  # a bind mount (a named volume has no host path here)
            paths[dst] = src
    if isinstance(service.get("entrypoint"), list):
        entrypoint = service["entrypoint"]
    full = [*entrypoint, *(command or service.get("command") or image_cmd)]
    published, container_port = None, None
    if "--port" in full and detach and name:  # a detached server: publish its port on loopback
        container_port = int(full[full.index("--port") + 1])
        local = _free_port()
        full[full.index("--port") + 1] = str(local)
        if "--host" in full:
            full[full.index("--host") + 1] = "127.0.0.1"
        published = f"127.0.0.1:{local}"

    def local_path(value: str) -> str:
        for dst, src in sorted(paths.items(), key=lambda kv: -len(kv[0])):
            if value == dst or value.startswith(dst + "/"):
                return src + value[len(dst):]
        return value

    env = {k: local_path(_map_hosts(v)) for k, v in env.items()}
    python_bin = str(Path(os.environ["SHIM_PYTHON"]).parent)
    full = [local_path(_map_hosts(part)) for part in full]
    if full and full[0] in ("python3", "python"):
        full[0] = os.environ["SHIM_PYTHON"]
    elif full and Path(full[0]).is_file() and not os.access(full[0], os.X_OK):  # made executable in the image
        full.insert(0, "/bin/sh")
    process_env = {"PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
                   **env}
    proc = subprocess.Popen(full, env=process_env, stdin=subprocess.DEVNULL, start_new_session=True)
    if name:
        (_state() / f"{name}.json").write_text(json.dumps({"pid": proc.pid, "service": service_name, "env": env,
                                                           "argv": full, "published": published,
                                                           "port": container_port, "remove": remove}))
    if detach:
        if published:  # like a healthy container: wait until it listens
            host, port_s = published.split(":")
            for _ in range(200):
                try:
                    socket.create_connection((host, int(port_s)), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
        return 0
    code = proc.wait()
    return 128 - code if code < 0 else code


def _kill(name: str, grace: float) -> int:
    path = _state() / f"{name}.json"
    if not path.is_file():
        print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
        return 1
    pid = json.loads(path.read_text())["pid"]
    try:
        os.killpg(pid, signal.SIGTERM)
        for _ in range(int(grace * 20)):
            os.killpg(pid, 0)
            time.sleep(0.05)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


def _signal(name: str, sig: signal.Signals) -> int:
    path = _state() / f"{name}.json"
    if not path.is_file():
        print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
        return 1
    try:
        os.killpg(json.loads(path.read_text())["pid"], sig)
    except ProcessLookupError:
        pass
    return 0


def main(argv: list[str]) -> int:
    with (_state() / "calls.log").open("a") as log:
        log.write(json.dumps(argv) + "\n")
    if argv[:1] == ["compose"]:
        return compose_run(argv[1:])
    if argv[:1] == ["stop"]:
        rest, grace = argv[1:], 10.0
        if rest[:1] == ["-t"]:
            grace, rest = float(rest[1]), rest[2:]
        return max([_kill(n, grace) for n in rest] or [0])
    if argv[:1] in (["pause"], ["unpause"]):  # the cgroup freezer, as signals to the container's processes
        return max([_signal(n, signal.SIGSTOP if argv[0] == "pause" else signal.SIGCONT) for n in argv[1:]] or [0])
    if argv[:2] == ["network", "rm"]:  # compose made the run's network; the shim has none to remove
        return 0
    if argv[:2] == ["rm", "-f"]:
        for name in argv[2:]:
            _kill(name, 0)
            (_state() / f"{name}.json").unlink(missing_ok=True)
        return 0
    sys.exit(f"docker shim: unsupported command {argv[:2]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
