"""Static checks of the deployment files: docker-compose.yml, the two Dockerfiles, the agent
entry point, the example gym config, Prometheus config and the Helm chart.

No Docker engine or cluster is needed: the files are parsed and cross-checked against the
code they start (the ``rsigym`` CLI, ``gateway.builder.service_modules()``, ``load_config``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from gateway.builder import service_modules

SERVICES = service_modules()
from gateway.cli.main import app as operator_cli
from services.core.config import load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SERVER_DOCKERFILE = ROOT / "deploy" / "Dockerfile"
AGENT_DOCKERFILE = ROOT / "agent_container" / "Dockerfile"
ENTRYPOINT = ROOT / "agent_container" / "entrypoint.sh"
CHART = ROOT / "deploy" / "helm" / "rsigym"

TRACKS = ("data", "harness", "joint", "offline")
PROFILES = (*TRACKS, "gpu", "cloud")
CORE = ("postgres", "redis", "rollout", "gateway")
AGENT_KEY_VAR = "RSIGYM_API_KEY"
# Anything that would hand an agent a platform or provider credential.
SECRET_PATTERNS = (
    re.compile(r"INTERNAL_SECRET"),
    re.compile(r"ADMIN_TOKEN"),
    re.compile(r"STORE_URL"),
    re.compile(r"PASSWORD|PGPASS"),
    re.compile(r"postgres(ql)?(\+\w+)?://", re.I),
    re.compile(r"(?<![A-Z0-9_])(?!RSIGYM_API_KEY\b)[A-Z0-9_]*_API_KEY\b"),
)
_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


# ---- helpers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def with_defaults(value: str) -> str:
    """Compose interpolation as an unconfigured checkout sees it: ``${X:-d}`` → ``d``, others → ``<X>``."""
    return _VAR.sub(lambda m: m["arg"] if m["op"] in (":-", "-") else f"<{m['name']}>", value)


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


def rsigym_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services run from the gateway/services image (ENTRYPOINT ["rsigym"])."""
    return {n: s for n, s in services.items() if dockerfile_of(s) == "deploy/Dockerfile"}


def agent_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if dockerfile_of(s) == "agent_container/Dockerfile"}


def active_in(service: dict[str, Any], profile: str) -> bool:
    profiles = service.get("profiles")
    return not profiles or profile in profiles


def listen_port(service: dict[str, Any]) -> int:
    ports = option(command_of(service), "--port")
    return int(ports[-1]) if ports else 8700


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


def copy_sources(args: str) -> list[str] | None:
    """Sources of a COPY/ADD (None for COPY --from=…, which reads another stage)."""
    if args.startswith("["):
        parts = json.loads(args)
    else:
        parts = shlex.split(args)
    flags = [p for p in parts if p.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        return None
    paths = [p for p in parts if not p.startswith("--")]
    assert len(paths) >= 2, f"COPY needs a source and a destination: {args}"
    return paths[:-1]


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def ignored_by_dockerignore(rel: str, patterns: list[str]) -> bool:
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").strip("/")
        hit = fnmatch.fnmatch(rel, pat) or (pat.startswith("**/") and fnmatch.fnmatch(rel, pat[3:]))
        if hit:
            ignored = not negate
    return ignored


# ---- compose: shape and profiles -----------------------------------------------------------------


def test_compose_parses_as_compose_spec(compose: dict[str, Any]) -> None:
    assert "version" not in compose, "compose spec: no `version:` key"
    assert isinstance(compose.get("services"), dict) and compose["services"]
    assert set(CORE) <= set(compose["services"])
    assert {"agent-data", "agent-harness", "agent-joint", "agent-offline", "prometheus"} <= set(compose["services"])
    declared_nets = set(compose.get("networks") or {})
    declared_vols = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        assert networks_of(svc) - {"default"} <= declared_nets, f"{name}: undeclared network"
        for vol in svc.get("volumes") or []:
            source = with_defaults(vol).split(":", 1)[0] if isinstance(vol, str) else vol.get("source", "")
            if source and not source.startswith((".", "/")):
                assert source in declared_vols, f"{name}: undeclared volume {source}"


def test_every_profile_is_used(services: dict[str, dict[str, Any]]) -> None:
    used = {p for svc in services.values() for p in svc.get("profiles") or []}
    missing = set(PROFILES) - used
    assert not missing, f"profiles not used by any service: {sorted(missing)}"


@pytest.mark.parametrize("profile", PROFILES)
def test_core_runs_in_every_profile(services: dict[str, dict[str, Any]], profile: str) -> None:
    absent = [name for name in CORE if not active_in(services[name], profile)]
    assert not absent, f"--profile {profile} would not start {absent}"


@pytest.mark.parametrize("profile", (*PROFILES, "ops"))
def test_dependencies_are_active_in_the_same_profile(services: dict[str, dict[str, Any]], profile: str) -> None:
    for name, svc in services.items():
        if not active_in(svc, profile):
            continue
        deps = svc.get("depends_on") or {}
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert active_in(services[dep], profile), f"--profile {profile}: {name} needs {dep}, which is off"


def test_one_agent_service_per_track(services: dict[str, dict[str, Any]]) -> None:
    agents = agent_services(services)
    assert set(agents) == {f"agent-{t}" for t in TRACKS}
    for track in TRACKS:
        assert agents[f"agent-{track}"].get("profiles") == [track]


# ---- compose: isolation of the agent -------------------------------------------------------------


def test_agents_are_only_on_the_internal_agentnet(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    assert compose["networks"]["agentnet"].get("internal") is True, "agentnet must have no route out"
    assert compose["networks"].get("backend", {}) is not None
    for name, svc in agent_services(services).items():
        assert networks_of(svc) == {"agentnet"}, f"{name} must be on agentnet only"
        assert "network_mode" not in svc
    on_agentnet = {n for n, s in services.items() if "agentnet" in networks_of(s)}
    assert on_agentnet == set(agent_services(services)) | {"gateway"}


def test_backend_holds_the_platform_but_no_agent(services: dict[str, dict[str, Any]]) -> None:
    for name in (*CORE, "prometheus"):
        assert "backend" in networks_of(services[name]), f"{name} should be on backend"
    assert not any("backend" in networks_of(s) for s in agent_services(services).values())


def test_agents_get_no_secret(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in agent_services(services).items():
        env = env_of(svc)
        assert set(env) == {"RSIGYM_URL", AGENT_KEY_VAR}, f"{name} env: {sorted(env)}"
        assert urlsplit(env["RSIGYM_URL"]).hostname == "gateway"
        assert "env_file" not in svc and "secrets" not in svc, f"{name} must not read env files or secrets"
        for key, value in env.items():
            for pat in SECRET_PATTERNS:
                assert not pat.search(key) and not pat.search(value), f"{name}: {key}={value} matches {pat.pattern}"


def test_secret_pattern_catches_provider_keys() -> None:
    hits = lambda s: any(p.search(s) for p in SECRET_PATTERNS)  # noqa: E731
    assert hits("OPENAI_API_KEY") and hits("${ANTHROPIC_API_KEY}") and hits("RSIGYM_INTERNAL_SECRET")
    assert hits("postgresql://rsigym@postgres:5432/rsigym") and hits("PGPASSWORD")
    assert not hits("RSIGYM_API_KEY") and not hits("${RSIGYM_API_KEY:-}") and not hits("http://gateway:8700")


def test_only_the_gateway_publishes_a_port_on_loopback(services: dict[str, dict[str, Any]]) -> None:
    publishing = {n for n, s in services.items() if s.get("ports")}
    assert publishing == {"gateway"}
    for port in services["gateway"]["ports"]:
        host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
        assert host_ip == "127.0.0.1", f"gateway port {port} must bind 127.0.0.1"
        published = port.get("target") if isinstance(port, dict) else int(str(port).rsplit(":", 1)[1])
        assert published == listen_port(services["gateway"])
    assert not any(s.get("network_mode") == "host" for s in services.values())


def test_platform_secrets_go_only_where_needed(services: dict[str, dict[str, Any]]) -> None:
    gateway, rollout = env_of(services["gateway"]), env_of(services["rollout"])
    assert {"RSIGYM_STORE_URL", "RSIGYM_INTERNAL_SECRET", "RSIGYM_ADMIN_TOKEN", "RSIGYM_CONFIG"} <= set(gateway)
    assert urlsplit(gateway["RSIGYM_STORE_URL"]).hostname == "postgres"
    assert "RSIGYM_INTERNAL_SECRET" in rollout and "RSIGYM_ADMIN_TOKEN" not in rollout and "RSIGYM_STORE_URL" not in rollout
    assert not any(k.endswith("_API_KEY") for k in gateway), "provider keys belong to rollout only"
    env_files = services["rollout"].get("env_file")
    paths = [e if isinstance(e, str) else e["path"] for e in (env_files if isinstance(env_files, list) else [env_files])]
    assert paths == [".env.providers"]
    assert not any(s.get("env_file") for n, s in services.items() if n != "rollout")


def test_required_compose_variables_are_documented() -> None:
    text = COMPOSE_FILE.read_text()
    example = (ROOT / ".env.example").read_text()
    required = {m["name"] for m in _VAR.finditer(text) if m["op"] in (":?", "?")}
    assert {"RSIGYM_INTERNAL_SECRET", "RSIGYM_ADMIN_TOKEN"} <= required
    for name in required | {m["name"] for m in _VAR.finditer(text)}:
        assert re.search(rf"^#? ?{name}=", example, re.M), f".env.example does not document {name}"
        assigned = re.search(rf"^{name}=(.*)$", example, re.M)
        if name in required and assigned:
            assert assigned[1].strip() == "", f".env.example must not carry a value for {name}"


# ---- compose: commands match the code ------------------------------------------------------------


def test_compose_commands_are_real_rsigym_subcommands(services: dict[str, dict[str, Any]]) -> None:
    runner = CliRunner()
    assert runner.invoke(operator_cli, ["serve", "--help"]).exit_code == 0
    served = rsigym_services(services)
    assert {"gateway", "rollout"} <= set(served)
    for name, svc in served.items():
        cmd = command_of(svc)
        assert cmd, f"{name}: give the rsigym subcommand explicitly"
        assert runner.invoke(operator_cli, [cmd[0], "--help"]).exit_code == 0, f"{name}: no subcommand {cmd[0]!r}"
        if cmd[0] == "serve":
            part = cmd[1]
            assert part == "gateway" or part in SERVICES, f"{name}: rsigym serve {part}: unknown part"
        # The whole command line parses (options exist), stopping at --help before it runs.
        result = runner.invoke(operator_cli, [*cmd, "--help"])
        assert result.exit_code == 0, f"{name}: `rsigym {' '.join(cmd)}` does not parse:\n{result.output}"
        assert option(cmd, "--host") == ["0.0.0.0"], f"{name} must listen on all interfaces of its container"


def test_every_service_is_served_and_wired_into_the_gateway(services: dict[str, dict[str, Any]]) -> None:
    gateway_cmd = command_of(services["gateway"])
    assert gateway_cmd[:2] == ["serve", "gateway"]
    wired: dict[str, str] = dict(item.split("=", 1) for item in option(gateway_cmd, "--service"))
    assert wired, "the gateway forwards to no service"
    for name, url in wired.items():
        assert name in SERVICES, f"--service {name}=…: not a known service ({sorted(SERVICES)})"
        parts = urlsplit(url)
        assert parts.scheme == "http" and parts.hostname in services, f"--service {name}={url}: no such compose service"
        target = services[parts.hostname]
        assert command_of(target)[:2] == ["serve", name], f"{parts.hostname} does not serve {name}"
        assert parts.port == listen_port(target), f"--service {name}={url}: {parts.hostname} listens on {listen_port(target)}"
        assert "backend" in networks_of(target) and "agentnet" not in networks_of(target)
    served = {command_of(s)[1] for s in rsigym_services(services).values() if command_of(s)[:1] == ["serve"]}
    assert served - {"gateway"} <= set(wired), "a service runs but the gateway does not forward to it"


def test_healthchecks_probe_the_port_each_part_listens_on(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in rsigym_services(services).items():
        port = listen_port(svc)
        if "healthcheck" in svc:
            assert str(port) in json.dumps(svc["healthcheck"]), f"{name}: healthcheck misses port {port}"
        else:
            assert int(env_of(svc).get("RSIGYM_HEALTH_PORT", "8700")) == port, f"{name}: image HEALTHCHECK probes the wrong port"


def test_config_is_mounted_read_only_where_it_is_read(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        target = env_of(svc).get("RSIGYM_CONFIG")
        if not target:
            continue
        mounts = [with_defaults(v) for v in svc.get("volumes") or [] if isinstance(v, str)]
        mounts = [v for v in mounts if v.split(":")[1] == target]
        assert mounts, f"{name}: RSIGYM_CONFIG={target} is not mounted"
        source, _, mode = mounts[0].partition(":" + target)
        assert mode == ":ro", f"{name}: mount the gym config read-only"
        assert (ROOT / source).is_file(), f"{name}: {source} does not exist"
        load_config(ROOT / source)


def test_prometheus_scrapes_the_gateway(services: dict[str, dict[str, Any]]) -> None:
    prom = services["prometheus"]
    assert str(prom["image"]).startswith("prom/prometheus")
    assert prom.get("profiles") == ["ops"]
    mounted = [v for v in prom["volumes"] if isinstance(v, str) and v.startswith("./")]
    assert any(v.split(":")[0] == "./deploy/prometheus.yml" for v in mounted)
    cfg = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = cfg["scrape_configs"]
    targets = [t for job in jobs for sc in job["static_configs"] for t in sc["targets"]]
    assert f"gateway:{listen_port(services['gateway'])}" in targets
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in jobs)


# ---- gym config and env examples -----------------------------------------------------------------


def test_example_gym_config_loads_and_names_its_keys_by_env() -> None:
    path = ROOT / "deploy" / "gym.example.toml"
    config = load_config(path)
    assert config.rollout.models and all(m.api_key_env for m in config.rollout.models)
    assert "ledger" in tomllib.loads(path.read_text())
    providers = (ROOT / "deploy" / "providers.env.example").read_text()
    for env_name in config.provider_key_envs():
        assert re.search(rf"^{env_name}=$", providers, re.M), f"providers.env.example lacks {env_name}"
        assert not re.search(rf"^{env_name}=\S", (ROOT / ".env.example").read_text(), re.M)


# ---- Dockerfiles and the agent entry point ---------------------------------------------------------


@pytest.mark.parametrize("path", [SERVER_DOCKERFILE, AGENT_DOCKERFILE], ids=["server", "agent"])
def test_dockerfile_base_user_and_copy_sources(path: Path) -> None:
    steps = dockerfile_instructions(path)
    froms = [args for word, args in steps if word == "FROM"]
    assert froms and all(args.split()[0].startswith("python:3.12") for args in froms)
    users = [args.split(":")[0] for word, args in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0"), f"{path.name}: the last USER must be non-root"
    patterns = dockerignore_patterns()
    for word, args in steps:
        if word not in ("COPY", "ADD"):
            continue
        for source in copy_sources(args) or []:
            rel = source.removeprefix("./").rstrip("/")
            assert (ROOT / rel).exists(), f"{path}: COPY source {source} is not in the repo"
            assert not ignored_by_dockerignore(rel, patterns), f"{path}: COPY source {source} is excluded by .dockerignore"


def test_server_dockerfile_installs_the_project_with_optional_extras() -> None:
    steps = dockerfile_instructions(SERVER_DOCKERFILE)
    text = " ".join(f"{w} {a}" for w, a in steps)
    assert any(w == "ARG" and re.fullmatch(r'EXTRAS=""', a) for w, a in steps)
    assert re.search(r"pip install --no-cache-dir \S*\$\{EXTRAS:\+\[\$EXTRAS\]\}", text)
    assert ("EXPOSE", "8700") in steps
    assert any(w == "ENTRYPOINT" and json.loads(a) == ["rsigym"] for w, a in steps)
    health = [a for w, a in steps if w == "HEALTHCHECK"]
    assert health and "/healthz" in health[0] and "python" in health[0] and "curl" not in health[0]
    # The project's packages are what it copies: pyproject.toml finds gateway*, services* and sdk/rsigym*.
    copied = {s.rstrip("/") for w, a in steps if w == "COPY" for s in copy_sources(a) or []}
    assert {"pyproject.toml", "README.md", "gateway", "services", "sdk"} <= copied


def test_agent_dockerfile_ships_the_sdk_only() -> None:
    steps = dockerfile_instructions(AGENT_DOCKERFILE)
    copied = [s.removeprefix("./").rstrip("/") for w, a in steps if w in ("COPY", "ADD") for s in copy_sources(a) or []]
    assert "sdk" in copied
    for source in copied:
        top = source.split("/")[0]
        assert top not in ("gateway", "services", "deploy", "tests", "."), f"agent image must not contain {source}"
        assert not source.startswith(".env")
    installs = " ".join(a for w, a in steps if w == "RUN" and "pip install" in a)
    assert re.search(r"\bopenai\b", installs) and re.search(r"\be2b\b", installs)
    assert not re.search(r"\b(rsigym\[|litellm|fastapi|uvicorn)", installs), "no server packages in the agent image"
    assert [a for w, a in steps if w == "USER"][-1] == "agent"
    env_text = " ".join(a for w, a in steps if w in ("ENV", "ARG"))
    assert not any(p.search(env_text) for p in SECRET_PATTERNS)
    assert any(w == "ENTRYPOINT" and "entrypoint" in a for w, a in steps)


def test_dockerignore_keeps_secrets_and_caches_out() -> None:
    patterns = dockerignore_patterns()
    for rel in (".venv", ".git", ".env", ".env.providers", ".pytest_cache", ".rsigym", "gateway/__pycache__"):
        assert ignored_by_dockerignore(rel, patterns), f".dockerignore lets {rel} into the build context"


def _fake_gym(tmp_path: Path, exit_code: int) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    gym = bindir / "gym"
    gym.write_text(f'#!/bin/sh\necho "gym $* $OPENAI_BASE_URL" >> "{tmp_path}/calls"\nexit {exit_code}\n')
    gym.chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("RSIGYM_", "OPENAI_"))}
    return {**keep, "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "RSIGYM_SMOKE_ATTEMPTS": "2"}


def test_entrypoint_refuses_to_start_without_url_and_key(tmp_path: Path) -> None:
    assert os.access(ENTRYPOINT, os.X_OK), "entrypoint.sh must be executable"
    env = _fake_gym(tmp_path, 0)
    for missing in ({}, {"RSIGYM_URL": "http://gateway:8700"}, {"RSIGYM_API_KEY": "rsk-x"}):
        result = subprocess.run(["sh", str(ENTRYPOINT), "true"], env={**env, **missing},
                                capture_output=True, text=True, timeout=30)
        assert result.returncode != 0 and "RSIGYM_" in result.stderr
    assert not (tmp_path / "calls").exists(), "gym must not run without both variables"


def test_entrypoint_smoke_checks_balance_then_execs(tmp_path: Path) -> None:
    env = {**_fake_gym(tmp_path, 0), "RSIGYM_URL": "http://gateway:8700/", "RSIGYM_API_KEY": "rsk-x"}
    result = subprocess.run(["sh", str(ENTRYPOINT), "sh", "-c", 'echo "ran $OPENAI_API_KEY"'], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ran rsk-x"
    assert (tmp_path / "calls").read_text().split() == ["gym", "balance", "http://gateway:8700/rollout/v1"]


def test_entrypoint_fails_when_the_gateway_does_not_answer(tmp_path: Path) -> None:
    env = {**_fake_gym(tmp_path, 1), "RSIGYM_URL": "http://gateway:8700", "RSIGYM_API_KEY": "rsk-x"}
    result = subprocess.run(["sh", str(ENTRYPOINT), "echo", "should-not-run"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "should-not-run" not in result.stdout
    assert len((tmp_path / "calls").read_text().splitlines()) == 2


# ---- Helm chart ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def _templates() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((CHART / "templates").iterdir()) if p.is_file()}


def test_chart_metadata_and_values_parse(chart_values: dict[str, Any], tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "rsigym" and chart["version"]
    for key in ("image", "store", "internalSecret", "providers", "gateway", "rollout"):
        assert key in chart_values, f"values.yaml lacks {key}"
    assert isinstance(chart_values["gateway"]["replicas"], int) and isinstance(chart_values["rollout"]["replicas"], int)
    assert chart_values["gateway"]["resources"] and chart_values["rollout"]["resources"]
    for ref in ("store", "internalSecret", "adminToken", "providers"):
        assert chart_values[ref]["secretName"], f"{ref} must reference a Secret"
    config_path = tmp_path / "gym.toml"
    config_path.write_text(chart_values["config"]["gymToml"])
    load_config(config_path)


def test_chart_templates_reference_only_existing_values(chart_values: dict[str, Any]) -> None:
    templates = _templates()
    assert {"_helpers.tpl", "configmap.yaml", "gateway.yaml", "rollout.yaml", "networkpolicy.yaml"} <= set(templates)
    refs = {m for text in templates.values() for m in re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", text)}
    assert refs
    for ref in sorted(refs):
        node: Any = chart_values
        for part in ref.strip(".").split("."):
            assert isinstance(node, dict) and part in node, f".Values{ref} is not in values.yaml"
            node = node[part]
    defined = {m for text in templates.values() for m in re.findall(r'define "([^"]+)"', text)}
    included = {m for text in templates.values() for m in re.findall(r'include "([^"]+)"', text)}
    assert included <= defined, f"undefined helpers: {sorted(included - defined)}"


def test_chart_wires_the_gateway_to_the_rollout_service() -> None:
    templates = _templates()
    gateway, rollout = templates["gateway.yaml"], templates["rollout.yaml"]
    assert "kind: Deployment" in gateway and "kind: Service" in gateway
    assert "kind: Deployment" in rollout and "kind: Service" in rollout
    assert "--service" in gateway and "rsigym.rolloutUrl" in gateway
    assert re.search(r"args: \[serve, rollout\b", rollout)
    for name in ("RSIGYM_STORE_URL", "RSIGYM_INTERNAL_SECRET", "RSIGYM_ADMIN_TOKEN"):
        assert name in gateway
    assert "RSIGYM_STORE_URL" not in rollout and "RSIGYM_ADMIN_TOKEN" not in rollout
    assert "secretKeyRef" in gateway and "envFrom" in rollout and "providers.secretName" in rollout
    assert "envFrom" not in gateway, "provider keys go to rollout pods only"


def test_networkpolicy_confines_agent_pods_to_the_gateway(chart_values: dict[str, Any]) -> None:
    text = _templates()["networkpolicy.yaml"]
    assert "kind: NetworkPolicy" in text and "rsigym/role" in text
    agent_policy = text.split("---")[0].replace("{{ .Values.networkPolicy.agentRole }}", chart_values["networkPolicy"]["agentRole"])
    assert re.search(r"^spec:\n  podSelector:\n    matchLabels:\n      rsigym/role: agent\n", agent_policy, re.M), \
        "the first policy must select the agent pods by rsigym/role: agent"
    assert "policyTypes: [Egress]" in agent_policy
    assert '"role" "gateway"' in agent_policy, "agent egress must target the gateway pods"
    assert '"role" "rollout"' not in agent_policy and "ipBlock" not in agent_policy
