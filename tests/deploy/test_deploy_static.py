"""Static checks of the deployment files: docker-compose.yml, deploy/Dockerfile (one build target
per role) and the agent's Dockerfile, the agent entry point, the example gym config, the Helm
chart, the Prometheus scrape config and alert rules, and the Grafana dashboard.

No Docker engine, cluster or Helm binary is needed: the files are parsed and cross-checked against
the code they start (the ``rsigym`` CLI, ``ops.builder.service_modules()``, ``load_config``,
the metrics the code registers) and against each other (compose and the Helm values describe the
same components with the same environment variable names). Where ``promtool`` is installed
(Debian package ``prometheus``) the alert rules are also checked and unit-tested with it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from gateway.metrics import GatewayMetrics
from kit import errors as gym_errors
from kit.config import load_config
from ops.builder import service_modules
from ops.cli.main import app as operator_cli
from tests.deploy.compose_local import (
    _VAR,
    COMPOSE_FILE,
    ROOT,
    active_in,
    command_of,
    dockerfile_instructions,
    dockerfile_of,
    dockerfile_stages,
    effective,
    env_of,
    listen_port,
    networks_of,
    option,
    stage_chain,
    target_of,
    with_defaults,
)
from tests.deploy.helm_template import Renderer, TemplateError, manifests, render_chart

SERVICES = service_modules()

SERVER_DOCKERFILE = ROOT / "deploy" / "Dockerfile"
AGENT_DOCKERFILE = ROOT / "agent_container" / "Dockerfile"
ENTRYPOINT = ROOT / "agent_container" / "entrypoint.sh"
CHART = ROOT / "deploy" / "helm" / "rsigym"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts.test.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "rsigym-dashboard.json"

TRACKS = ("data", "harness", "joint", "offline")
PROFILES = (*TRACKS, "gpu", "cloud")
SERVICE_NAMES = ("rollout", "training", "inference", "evaluation", "sandbox", "records")
CORE = ("postgres", "redis", *SERVICE_NAMES, "gateway", "worker-cpu")
ROLE_TARGETS = ("gateway", "service", "worker-cpu", "worker-gpu")
"""deploy/Dockerfile build targets, one per server role (the agent has its own Dockerfile)."""
QUEUES = ("training", "training-gpu", "evaluation")
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
# Variables whose value is (or may embed) a credential: in Helm they come from Secrets only.
SECRET_VARS = re.compile(r"SECRET|TOKEN|PASSWORD|PGPASS|STORE_URL|REDIS_URL|BROKER_URL|_API_KEY$")


# ---- helpers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


EGRESS = "egress"
"""The per-run egress allowlist proxy (kit/egress.py): built from the gateway image but not a
platform part — no store, no secret, started by the compose-mode launcher per run, not in a track."""


def rsigym_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The platform's parts: services run from an image of deploy/Dockerfile (ENTRYPOINT ["rsigym"]),
    the per-run egress proxy aside."""
    return {n: s for n, s in services.items() if dockerfile_of(s) == "deploy/Dockerfile" and n != EGRESS}


def served(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The compose services that run ``rsigym serve …`` (they answer /healthz on their port)."""
    return {n: s for n, s in rsigym_services(services).items() if command_of(s)[:1] == ["serve"]}


def agent_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if dockerfile_of(s) == "agent_container/Dockerfile"}


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




# ---- Helm values: the chart's components, named as compose names them ---------------------------


@pytest.fixture(scope="module")
def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def _templates() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((CHART / "templates").iterdir()) if p.is_file()}


def helm_components(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """compose service name → its Helm values: gateway, services.<name>, workers.<key> (worker-<key>)."""
    out = {"gateway": values["gateway"]}
    out.update(values["services"])
    out.update({f"worker-{key}": w for key, w in values["workers"].items() if w.get("enabled", True)})
    return out


def helm_command(name: str, component: dict[str, Any], values: dict[str, Any]) -> list[str]:
    """The container args the chart's templates build for a component (gateway.yaml, services.yaml,
    workers.yaml), from the same values."""
    if name == "gateway":
        cmd = ["serve", "gateway", "--host", "0.0.0.0", "--port", str(component["port"])]
        for svc, spec in values["services"].items():
            cmd += ["--service", f"{svc}=http://<release>-{svc}:{spec['port']}"]
        return cmd
    if name.startswith("worker-"):
        return ["worker", "--queues", ",".join(component["queues"])]
    return ["serve", name, "--host", "0.0.0.0", "--port", str(component["port"])]


def helm_env_names(component: dict[str, Any]) -> set[str]:
    return set(component.get("env") or {}) | set(component.get("secretEnv") or {})


# ---- metrics the code registers -----------------------------------------------------------------

_METRIC_CTOR = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary|CounterMetricFamily|GaugeMetricFamily|HistogramMetricFamily)\(\s*"
    r"\"(rsigym_[a-z0-9_]+)\"")


def registered_metrics() -> dict[str, set[str]]:
    """Exposed series name → label names, for every rsigym_* metric the code defines: the gateway's
    registry (instantiated) and any other prometheus_client constructor in gateway/ and services/
    (the job queue figures). Counters expose ``_total``, histograms ``_bucket``/``_sum``/``_count``."""
    kinds: dict[str, tuple[str, set[str]]] = {}
    for path in [*(ROOT / "gateway").rglob("*.py"), *(ROOT / "services").rglob("*.py")]:
        text = path.read_text()
        for m in _METRIC_CTOR.finditer(text):
            labels_list = re.search(r"\[([^\]]*)\]", text[m.end():m.end() + 600])
            labels = set(re.findall(r"\"([a-z_]+)\"", labels_list[1])) if labels_list else set()
            kinds[m[2].removesuffix("_total")] = (m[1].removesuffix("MetricFamily").lower(), labels)
    gateway_metrics = GatewayMetrics()
    for family in gateway_metrics.registry.collect():
        kinds.setdefault(family.name, (family.type, set()))
    for instrument in vars(gateway_metrics).values():  # label names as registered (not as grepped)
        name = getattr(instrument, "_name", None)
        if name in kinds:
            kinds[name] = (kinds[name][0], set(getattr(instrument, "_labelnames", ())) or kinds[name][1])
    exposed: dict[str, set[str]] = {}
    for base, (kind, labels) in kinds.items():
        if kind == "counter":
            exposed[f"{base}_total"] = labels
        elif kind in ("histogram", "summary"):
            for suffix in ("_bucket", "_sum", "_count"):
                exposed[base + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            exposed[base] = labels
    return exposed


_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                    "unless"}


def promql_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(rsigym_[a-z0-9_]+)", expr))


def promql_grouping_labels(expr: str) -> set[str]:
    return {label.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
            for label in group.split(",") if label.strip()}


def promql_matchers(expr: str) -> list[tuple[str, str, str, str]]:
    """(metric, label, op, value) of every ``metric{label op "value"}`` matcher."""
    out = []
    for metric, body in re.findall(r"\b(rsigym_[a-z0-9_]+)\{([^}]*)\}", expr):
        for label, op, value in re.findall(r"([a-z_]+)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"", body):
            out.append((metric, label, op, value))
    return out


# ---- compose: shape and profiles -----------------------------------------------------------------


def test_compose_parses_as_compose_spec(compose: dict[str, Any]) -> None:
    assert "version" not in compose, "compose spec: no `version:` key"
    assert isinstance(compose.get("services"), dict) and compose["services"]
    assert set(CORE) <= set(compose["services"])
    assert {"agent-data", "agent-harness", "agent-joint", "agent-offline", "prometheus", "grafana",
            "worker-gpu"} <= set(compose["services"])
    declared_nets = set(compose.get("networks") or {})
    declared_vols = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        assert networks_of(svc) - {"default"} <= declared_nets, f"{name}: undeclared network"
        for vol in svc.get("volumes") or []:
            source = with_defaults(vol).split(":", 1)[0] if isinstance(vol, str) else vol.get("source", "")
            if source and not source.startswith((".", "/")):
                assert source in declared_vols, f"{name}: undeclared volume {source}"
            elif source.startswith("./") and "metrics-token" not in source:  # the token file is the operator's
                assert (ROOT / source).exists(), f"{name}: mounts {source}, which is not in the repo"


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


def test_the_gpu_worker_runs_only_with_the_gpu_profile_and_reserves_a_gpu(services: dict[str, dict[str, Any]]) -> None:
    gpu = services["worker-gpu"]
    assert gpu.get("profiles") == ["gpu"]
    assert target_of(gpu) == "worker-gpu"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    assert not any("deploy" in s for n, s in services.items() if n != "worker-gpu"), "only worker-gpu claims a GPU"
    assert option(command_of(gpu), "--queues") == ["training-gpu"]
    assert option(command_of(services["worker-cpu"]), "--queues") == ["training,evaluation"]
    consumed = {q for s in rsigym_services(services).values() for opt in option(command_of(s), "--queues")
                for q in opt.split(",")}
    assert consumed == set(QUEUES), f"queues nobody consumes: {set(QUEUES) - consumed}"


def test_jobs_go_to_celery_over_the_compose_redis(services: dict[str, dict[str, Any]]) -> None:
    """The services that send jobs and the workers that run them agree on backend and broker."""
    for name in ("training", "evaluation", "worker-cpu", "worker-gpu"):
        env = env_of(services[name])
        assert env.get("RSIGYM_JOBS_BACKEND") == "celery", f"{name}: jobs would run in-process"
        broker = urlsplit(env["RSIGYM_WORKER_BROKER_URL"])
        assert broker.scheme == "redis" and broker.hostname == "redis" and broker.hostname in services
        assert "redis" in (services[name].get("depends_on") or {})
        # they revoke the keys they mint for trials: every gateway replica must hear it at once
        assert urlsplit(env["RSIGYM_REDIS_URL"]).hostname == "redis", f"{name}: key revocations not fanned out"
    fanout = urlsplit(env_of(services["gateway"])["RSIGYM_REDIS_URL"])
    assert fanout.scheme == "redis" and fanout.hostname == "redis"


def test_every_part_that_writes_or_checks_records_anchors_them_in_the_compose_redis(
        services: dict[str, dict[str, Any]]) -> None:
    """Record chains' heads are anchored in Redis when RSIGYM_REDIS_URL is set (services/records/
    record_anchor.py): a part without it would anchor to a file of its own, and checks elsewhere
    would read its runs as unverifiable. The chart's parts get the same variables (checked below)."""
    for name in ("gateway", "training", "evaluation", "sandbox", "records", "worker-cpu", "worker-gpu"):
        assert urlsplit(env_of(services[name])["RSIGYM_REDIS_URL"]).hostname == "redis", name
    assert command_of(services["redis"])[:3] == ["redis-server", "--appendonly", "yes"], "anchors lost on a restart"


def test_the_shared_data_volume_reaches_everything_that_reads_or_writes_files(services: dict[str, dict[str, Any]]) -> None:
    """Datasets and checkpoints written by training and the workers are read by inference and
    evaluation: all of them mount the one gymdata volume at the image's data dir."""
    data_dirs = {m for w, a in dockerfile_instructions(SERVER_DOCKERFILE) if w == "ENV"
                 for m in re.findall(r"RSIGYM_DATA_DIR=(\S+)", a)}
    assert data_dirs == {"/var/lib/rsigym"}, "every image keeps its data dir where gymdata is mounted"
    mounting = {n for n, s in services.items() if "gymdata:/var/lib/rsigym" in (s.get("volumes") or [])}
    assert mounting == {"training", "inference", "evaluation", "records", "worker-cpu", "worker-gpu"}


# ---- compose: isolation of the agent -------------------------------------------------------------


def test_agents_are_only_on_the_internal_agentnet(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    assert compose["networks"]["agentnet"].get("internal") is True, "agentnet must have no route out"
    assert compose["networks"].get("backend", {}) is not None
    for name, svc in agent_services(services).items():
        assert networks_of(svc) == {"agentnet"}, f"{name} must be on agentnet only"
        assert "network_mode" not in svc
    on_agentnet = {n for n, s in services.items() if "agentnet" in networks_of(s)}
    assert on_agentnet == set(agent_services(services)) | {"gateway", EGRESS}


def test_the_egress_proxy_is_the_agents_only_way_out_and_holds_nothing(compose: dict[str, Any],
                                                                       services: dict[str, dict[str, Any]]) -> None:
    """Only the egress proxy joins agentnet to a network with a route out; it runs the real
    ``rsigym egress-proxy`` with its allowlist and no platform secret, and no track starts it (the
    compose-mode launcher starts one per run whose task allows a host)."""
    egress = services[EGRESS]
    assert networks_of(egress) == {"agentnet", "egress"}
    assert not compose["networks"]["egress"] or compose["networks"]["egress"].get("internal") is not True
    with_route_out = {n for n, s in services.items() if "egress" in networks_of(s)}
    assert with_route_out == {EGRESS}
    assert egress.get("profiles") == ["egress"]
    assert_real_rsigym_command("compose egress", command_of(egress))
    assert option(command_of(egress), "--port") == ["3128"]
    assert env_of(egress) == {"RSIGYM_EGRESS_ALLOW": "${RSIGYM_EGRESS_ALLOW:-}"}
    assert not egress.get("volumes") and not egress.get("env_file") and not egress.get("ports")
    assert egress.get("cap_drop") == ["ALL"] and "no-new-privileges:true" in egress.get("security_opt", [])


def test_backend_holds_the_platform_but_no_agent(services: dict[str, dict[str, Any]]) -> None:
    for name in (*CORE, "worker-gpu", "prometheus", "grafana"):
        assert networks_of(services[name]) == ({"agentnet", "backend"} if name == "gateway" else {"backend"}), name
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
    envs = {n: env_of(s) for n, s in rsigym_services(services).items()}
    assert {"RSIGYM_STORE_URL", "RSIGYM_INTERNAL_SECRET", "RSIGYM_ADMIN_TOKEN", "RSIGYM_CONFIG"} <= set(envs["gateway"])
    assert [n for n, e in envs.items() if "RSIGYM_ADMIN_TOKEN" in e] == ["gateway"], "admin token: gateway only"
    assert [n for n, e in envs.items() if "RSIGYM_METRICS_TOKEN" in e] == ["gateway"]
    assert all("RSIGYM_INTERNAL_SECRET" in e for e in envs.values()), "every part verifies or signs identities"
    rollout = envs["rollout"]
    assert "RSIGYM_STORE_URL" not in rollout and "PGPASSWORD" not in rollout, "rollout holds provider keys: no store"
    for name, env in envs.items():
        if "RSIGYM_STORE_URL" in env:
            assert urlsplit(env["RSIGYM_STORE_URL"]).hostname == "postgres", name
            assert urlsplit(env["RSIGYM_STORE_URL"]).password is None, f"{name}: the password goes in PGPASSWORD"
            assert "PGPASSWORD" in env, name
        assert not any(k.endswith("_API_KEY") for k in env), f"{name}: provider keys belong to rollout's env file"
    env_files = services["rollout"].get("env_file")
    paths = [e if isinstance(e, str) else e["path"] for e in (env_files if isinstance(env_files, list) else [env_files])]
    assert paths == [".env.providers"]
    assert not any(s.get("env_file") for n, s in services.items() if n != "rollout")


def test_only_sandboxing_containers_drop_the_runtime_seccomp_profile(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in rsigym_services(services).items():
        opts = svc.get("security_opt") or []
        assert "no-new-privileges:true" in opts and svc.get("cap_drop") == ["ALL"], name
        assert "privileged" not in svc and not svc.get("cap_add"), f"{name}: no privileges"
        unconfined = "seccomp=unconfined" in opts
        assert unconfined == (name in {"training", "evaluation", "sandbox", "worker-cpu", "worker-gpu"}), name


def test_required_compose_variables_are_documented() -> None:
    text = COMPOSE_FILE.read_text()
    example = (ROOT / ".env.example").read_text()
    required = {m["name"] for m in _VAR.finditer(text) if m["op"] in (":?", "?")}
    assert {"RSIGYM_INTERNAL_SECRET", "RSIGYM_ADMIN_TOKEN", "POSTGRES_PASSWORD"} <= required
    for name in required | {m["name"] for m in _VAR.finditer(text)}:
        assert re.search(rf"^#? ?{name}=", example, re.M), f".env.example does not document {name}"
        assigned = re.search(rf"^{name}=(.*)$", example, re.M)
        if name in required and assigned:
            assert assigned[1].strip() == "", f".env.example must not carry a value for {name}"


# ---- compose: commands match the code ------------------------------------------------------------


def assert_real_rsigym_command(where: str, cmd: list[str]) -> None:
    """``rsigym <cmd> --help`` parses: the subcommand and every option in ``cmd`` exist."""
    runner = CliRunner()
    assert cmd, f"{where}: give the rsigym subcommand explicitly"
    top = runner.invoke(operator_cli, [cmd[0], "--help"])
    assert top.exit_code == 0, f"{where}: `rsigym {cmd[0]}` is not a command of ops/cli/main.py:\n{top.output}"
    if cmd[0] == "serve":
        assert cmd[1] == "gateway" or cmd[1] in SERVICES, f"{where}: rsigym serve {cmd[1]}: unknown part"
        assert option(cmd, "--host") == ["0.0.0.0"], f"{where} must listen on all interfaces of its container"
    if cmd[0] == "worker":
        queues = option(cmd, "--queues")
        assert len(queues) == 1 and set(queues[0].split(",")) <= set(QUEUES), f"{where}: unknown queue in {queues}"
    # The whole command line parses (options exist), stopping at --help before it runs.
    result = runner.invoke(operator_cli, [*cmd, "--help"])
    assert result.exit_code == 0, f"{where}: `rsigym {' '.join(cmd)}` does not parse:\n{result.output}"


def test_compose_commands_are_real_rsigym_subcommands(services: dict[str, dict[str, Any]]) -> None:
    runnable = rsigym_services(services)
    assert set(SERVICE_NAMES) | {"gateway", "worker-cpu", "worker-gpu"} == set(runnable)
    for name, svc in runnable.items():
        assert_real_rsigym_command(f"compose {name}", command_of(svc))


def test_every_service_is_served_and_wired_into_the_gateway(services: dict[str, dict[str, Any]]) -> None:
    gateway_cmd = command_of(services["gateway"])
    assert gateway_cmd[:2] == ["serve", "gateway"]
    wired: dict[str, str] = dict(item.split("=", 1) for item in option(gateway_cmd, "--service"))
    assert set(wired) == set(SERVICES), f"the gateway forwards to {sorted(wired)}, the code has {sorted(SERVICES)}"
    for name, url in wired.items():
        parts = urlsplit(url)
        assert parts.scheme == "http" and parts.hostname in services, f"--service {name}={url}: no such compose service"
        target = services[parts.hostname]
        assert command_of(target)[:2] == ["serve", name], f"{parts.hostname} does not serve {name}"
        assert parts.port == listen_port(target), f"--service {name}={url}: {parts.hostname} listens on {listen_port(target)}"
        assert "backend" in networks_of(target) and "agentnet" not in networks_of(target)
        assert (services["gateway"]["depends_on"][parts.hostname] == {"condition": "service_healthy"})
    ports = [listen_port(s) for s in served(services).values()]
    assert len(ports) == len(set(ports)), "two parts listen on one port"


def test_healthchecks_probe_the_port_each_part_listens_on(services: dict[str, dict[str, Any]]) -> None:
    stages = dockerfile_stages(SERVER_DOCKERFILE)
    for name, svc in served(services).items():
        port = listen_port(svc)
        assert "/healthz" in (effective(stages, target_of(svc), "HEALTHCHECK") or ""), f"{name}: image has no healthcheck"
        if "healthcheck" in svc:
            assert str(port) in json.dumps(svc["healthcheck"]), f"{name}: healthcheck misses port {port}"
        else:
            assert int(env_of(svc).get("RSIGYM_HEALTH_PORT", "8700")) == port, f"{name}: image HEALTHCHECK probes the wrong port"
    for name in ("worker-cpu", "worker-gpu"):  # no HTTP: a /healthz probe would mark them unhealthy forever
        assert effective(stages, target_of(services[name]), "HEALTHCHECK") == "NONE", name
        assert "RSIGYM_HEALTH_PORT" not in env_of(services[name])


def test_config_is_mounted_read_only_where_it_is_read(services: dict[str, dict[str, Any]]) -> None:
    readers = set()
    for name, svc in services.items():
        target = env_of(svc).get("RSIGYM_CONFIG")
        if not target:
            continue
        readers.add(name)
        mounts = [with_defaults(v) for v in svc.get("volumes") or [] if isinstance(v, str)]
        mounts = [v for v in mounts if v.split(":")[1] == target]
        assert mounts, f"{name}: RSIGYM_CONFIG={target} is not mounted"
        source, _, mode = mounts[0].partition(":" + target)
        assert mode == ":ro", f"{name}: mount the gym config read-only"
        assert (ROOT / source).is_file(), f"{name}: {source} does not exist"
        load_config(ROOT / source)
    assert readers == set(rsigym_services(services)), "every rsigym part reads the same gym config"


def test_prometheus_scrapes_the_gateway_and_loads_the_alert_rules(services: dict[str, dict[str, Any]]) -> None:
    prom = services["prometheus"]
    assert str(prom["image"]).startswith("prom/prometheus")
    assert prom.get("profiles") == ["ops"]
    mounts = dict(v.split(":")[:2] for v in prom["volumes"] if isinstance(v, str) and v.startswith("./"))
    assert mounts["./deploy/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    cfg = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = cfg["scrape_configs"]
    targets = [t for job in jobs for sc in job["static_configs"] for t in sc["targets"]]
    assert f"gateway:{listen_port(services['gateway'])}" in targets
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in jobs)
    # /metrics is admin-only: the scrape token file must be the one compose mounts.
    token_files = {job["authorization"]["credentials_file"] for job in jobs}
    mounted = {with_defaults(v).split(":")[1] for v in prom["volumes"] if isinstance(v, str)}
    assert token_files <= mounted
    for rule_file in cfg["rule_files"]:
        source = {t: s for s, t in mounts.items()}.get(rule_file)
        assert source and (ROOT / source).resolve() == ALERTS, f"rule file {rule_file} is not deploy/prometheus/alerts.yml"


def test_grafana_is_provisioned_with_the_dashboard_and_prometheus(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    assert grafana.get("profiles") == ["ops"] and "ports" not in grafana
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if isinstance(v, str) and v.startswith("./"))
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rsigym.yml").read_text())["providers"]
    dash_dir = providers[0]["options"]["path"]
    assert mounts["./deploy/grafana/rsigym-dashboard.json"] == f"{dash_dir}/rsigym-dashboard.json"
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "rsigym.yml").read_text())["datasources"]
    prom = urlsplit(sources[0]["url"])
    assert sources[0]["type"] == "prometheus" and prom.hostname == "prometheus" and prom.port == 9090
    dashboard = json.loads(DASHBOARD.read_text())
    ds_var = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    assert ds_var["current"]["value"] == sources[0]["uid"], "the dashboard's default datasource is the provisioned one"


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
    stages = dockerfile_stages(path)
    for name, stage in stages.items():
        base = stage["base"]
        allowed = base in stages or base.startswith("python:3.12") or (name == "worker-gpu" and base.startswith("nvidia/cuda:"))
        assert allowed, f"{path.name}: stage {name} builds FROM {base}"
    final = list(stages)[-1]
    user = effective(stages, final, "USER")
    assert user and user.split(":")[0] not in ("root", "0"), f"{path.name}: the default target must run as non-root"
    patterns = dockerignore_patterns()
    for word, args in dockerfile_instructions(path):
        if word not in ("COPY", "ADD"):
            continue
        for source in copy_sources(args) or []:
            rel = source.removeprefix("./").rstrip("/")
            assert (ROOT / rel).exists(), f"{path}: COPY source {source} is not in the repo"
            assert not ignored_by_dockerignore(rel, patterns), f"{path}: COPY source {source} is excluded by .dockerignore"


def test_every_role_has_a_build_target_that_runs_rsigym_as_non_root() -> None:
    stages = dockerfile_stages(SERVER_DOCKERFILE)
    assert set(ROLE_TARGETS) <= set(stages), f"missing build targets: {set(ROLE_TARGETS) - set(stages)}"
    for target in (*ROLE_TARGETS, list(stages)[-1]):
        user = effective(stages, target, "USER")
        assert user and user.split(":")[0] not in ("root", "0"), f"target {target} runs as root"
        assert json.loads(effective(stages, target, "ENTRYPOINT") or "null") == ["rsigym"], target
        cmd = json.loads(effective(stages, target, "CMD") or "[]")
        assert_real_rsigym_command(f"Dockerfile target {target} CMD", cmd)
    # Secrets arrive at run time; nothing that looks like one is set in an image.
    for word, args in dockerfile_instructions(SERVER_DOCKERFILE):
        if word in ("ENV", "ARG"):
            assert not any(p.search(args) for p in SECRET_PATTERNS), f"{word} {args}"
            assert not SECRET_VARS.search(args.split("=")[0]), f"{word} {args}"


def _installs(stages: dict[str, dict[str, Any]], target: str) -> str:
    return " ".join(a for s in stage_chain(stages, target) for w, a in stages[s]["steps"] if w == "RUN" and "pip install" in a)


def _arg(stages: dict[str, dict[str, Any]], target: str, name: str) -> str | None:
    for stage in stage_chain(stages, target):
        for w, a in stages[stage]["steps"]:
            if w == "ARG" and a.split("=")[0] == name:
                return json.loads(a.split("=", 1)[1]) if "=" in a else ""
    return None


def test_each_role_installs_the_project_with_its_extras() -> None:
    stages = dockerfile_stages(SERVER_DOCKERFILE)
    wheel = next(n for n, s in stages.items() if any("pip wheel" in a for w, a in s["steps"] if w == "RUN"))
    copied = {s.rstrip("/") for w, a in stages[wheel]["steps"] if w == "COPY" for s in copy_sources(a) or []}
    assert {"pyproject.toml", "README.md", "gateway", "services", "sdk"} <= copied
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for target in ROLE_TARGETS:
        text = _installs(stages, target)
        assert f"from={wheel}" in text and "rsigym-*.whl" in text, f"{target}: does not install the built wheel"
        arg = _arg(stages, target, "EXTRAS")
        if target == "gateway":
            assert arg is None and "EXTRAS" not in text, "the gateway image carries no ML stack"
            continue
        assert re.search(r"\$\{EXTRAS:\+\[\$EXTRAS\]\}", text), f"{target}: EXTRAS not installed"
        assert set(filter(None, (arg or "").split(","))) <= extras, f"{target}: unknown extra in {arg!r}"
    assert _arg(stages, "service", "EXTRAS") == "local"
    assert "gpu" in _arg(stages, "worker-gpu", "EXTRAS").split(",")
    assert stages["worker-gpu"]["base"].startswith("nvidia/cuda:") and "runtime" in stages["worker-gpu"]["base"]
    for target in ("service", "worker-cpu", "worker-gpu"):  # sandboxes, trials and custom losses run in bubblewrap
        runs = " ".join(a for s in stage_chain(stages, target) for w, a in stages[s]["steps"] if w == "RUN")
        assert "bubblewrap" in runs, f"{target}: no bubblewrap"
    gateway_runs = " ".join(a for s in stage_chain(stages, "gateway") for w, a in stages[s]["steps"] if w == "RUN")
    assert "bubblewrap" not in gateway_runs


def test_compose_and_helm_use_only_existing_build_targets(services: dict[str, dict[str, Any]], chart_values: dict[str, Any]) -> None:
    stages = dockerfile_stages(SERVER_DOCKERFILE)
    for name, svc in rsigym_services(services).items():
        assert target_of(svc) in ROLE_TARGETS, f"compose {name}: build target {target_of(svc)!r}"
        image = with_defaults(svc["image"]).split(":")[0]
        assert image == f"rsigym-{target_of(svc)}", f"compose {name}: image {image} for target {target_of(svc)}"
        if target_of(svc) != "worker-gpu" and svc["build"].get("args", {}).get("EXTRAS"):
            assert _arg(stages, target_of(svc), "EXTRAS") is not None, f"{name}: passes EXTRAS to a target without it"
    for svc in agent_services(services).values():
        assert with_defaults(svc["image"]).split(":")[0] == "rsigym-agent"
    repos = chart_values["image"]["repositories"]
    assert set(repos) == set(ROLE_TARGETS), "image.repositories: one per deploy/Dockerfile role target"
    assert all(repo == f"rsigym-{target}" for target, repo in repos.items()), "Helm and compose name images alike"
    for name, component in helm_components(chart_values).items():
        assert component["image"] in repos, f"helm {name}: image {component['image']!r}"
    assert chart_values["gateway"]["image"] == "gateway"


def test_agent_dockerfile_ships_the_sdk_only() -> None:
    steps = dockerfile_instructions(AGENT_DOCKERFILE)
    copied = [s.removeprefix("./").rstrip("/") for w, a in steps if w in ("COPY", "ADD") for s in copy_sources(a) or []]
    assert "sdk" in copied
    for source in copied:
        top = source.split("/")[0]
        assert top not in ("gateway", "services", "deploy", "tests", "."), f"agent image must not contain {source}"
        assert not source.startswith(".env")
    installs = " ".join(a for w, a in steps if w == "RUN" and "pip install" in a)
    sdk = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    clients = " ".join(sdk["clients"])  # the unmodified clients the agent guide documents, through the SDK's extra
    assert "rsigym-sdk[mcp,clients]" in installs
    assert re.search(r"\bopenai\b", clients) and re.search(r"\be2b\b", clients) and "tinker==" in clients
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
    assert (tmp_path / "calls").read_text().split() == ["gym", "balance", "http://gateway:8700/agent/v1"]


def test_entrypoint_fails_when_the_gateway_does_not_answer(tmp_path: Path) -> None:
    env = {**_fake_gym(tmp_path, 1), "RSIGYM_URL": "http://gateway:8700", "RSIGYM_API_KEY": "rsk-x"}
    result = subprocess.run(["sh", str(ENTRYPOINT), "echo", "should-not-run"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "should-not-run" not in result.stdout
    assert len((tmp_path / "calls").read_text().splitlines()) == 2




# ---- Helm chart ------------------------------------------------------------------------------------


def test_chart_metadata_and_values_parse(chart_values: dict[str, Any], tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "rsigym" and chart["version"]
    for key in ("image", "secrets", "providers", "data", "migrations", "gateway", "services", "workers",
                "networkPolicy", "metrics", "config"):
        assert key in chart_values, f"values.yaml lacks {key}"
    for name, component in helm_components(chart_values).items():
        assert isinstance(component["replicas"], int) and component["replicas"] >= 1, name
        res = component["resources"]
        assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"], f"{name}: resources"
    assert chart_values["gateway"]["replicas"] >= 2, "the gateway runs replicated"
    assert chart_values["gateway"]["autoscaling"]["minReplicas"] >= 2
    for ref, secret in chart_values["secrets"].items():
        assert secret["name"] and secret["key"], f"secrets.{ref} must name a Secret and a key"
    config_path = tmp_path / "gym.toml"
    config_path.write_text(chart_values["config"]["gymToml"])
    load_config(config_path)


def test_chart_templates_are_balanced_and_reference_only_existing_values(chart_values: dict[str, Any]) -> None:
    templates = _templates()
    assert {"_helpers.tpl", "configmap.yaml", "gateway.yaml", "services.yaml", "workers.yaml", "networkpolicy.yaml",
            "migrate-job.yaml", "data-pvc.yaml", "servicemonitor.yaml"} <= set(templates)
    for name, text in templates.items():
        actions = re.findall(r"\{\{-?\s*(?:/\*.*?\*/\s*)?(\w+)?", text, re.S)
        opened = sum(a in ("if", "range", "with", "define") for a in actions)
        assert opened == actions.count("end"), f"{name}: {opened} blocks opened, {actions.count('end')} ended"
        assert "{{" not in re.sub(r"\{\{.*?\}\}", "", text, flags=re.S), f"{name}: an action is not closed"
    refs = {m for text in templates.values() for m in re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", text)}
    assert refs
    for ref in sorted(refs):
        node: Any = chart_values
        for part in ref.strip(".").split("."):
            assert isinstance(node, dict) and part in node, f".Values{ref} is not in values.yaml"
            node = node[part]
    defined = {m for text in templates.values() for m in re.findall(r'define "([^"]+)"', text)}
    included = {m for text in templates.values() for m in re.findall(r'include "([^"]+)"', text)}
    included |= {m for c in helm_components(chart_values).values() for v in (c.get("env") or {}).values()
                 for m in re.findall(r'include "([^"]+)"', str(v))}
    assert included <= defined, f"undefined helpers: {sorted(included - defined)}"


def test_helm_values_and_compose_describe_the_same_components_and_environment(
        services: dict[str, dict[str, Any]], chart_values: dict[str, Any]) -> None:
    """The acceptance check: same components, and per component the same environment variable
    names, command, port, image role, data volume, provider keys and sandboxing in both."""
    helm = helm_components(chart_values)
    compose_parts = rsigym_services(services)
    assert set(helm) == set(compose_parts), f"only in helm: {set(helm) - set(compose_parts)}, " \
                                            f"only in compose: {set(compose_parts) - set(helm)}"
    for name, component in helm.items():
        svc = compose_parts[name]
        compose_env, helm_env = set(env_of(svc)), helm_env_names(component)
        assert compose_env == helm_env, (f"{name}: env only in compose {sorted(compose_env - helm_env)}, "
                                         f"only in helm {sorted(helm_env - compose_env)}")
        assert component["image"] == target_of(svc), f"{name}: helm image {component['image']}, compose {target_of(svc)}"
        compose_cmd = command_of(svc)
        helm_cmd = helm_command(name, component, chart_values)
        if name == "gateway":
            wired = {s.split("=", 1)[0]: urlsplit(s.split("=", 1)[1]).port for s in option(compose_cmd, "--service")}
            helm_wired = {s.split("=", 1)[0]: urlsplit(s.split("=", 1)[1]).port for s in option(helm_cmd, "--service")}
            assert wired == helm_wired, f"gateway forwards to {wired} in compose, {helm_wired} in helm"
            compose_cmd = [p for p in compose_cmd if p not in option(compose_cmd, "--service") and p != "--service"]
            helm_cmd = [p for p in helm_cmd if p not in option(helm_cmd, "--service") and p != "--service"]
        assert compose_cmd == helm_cmd, f"{name}: compose runs {compose_cmd}, helm {helm_cmd}"
        if "port" in component:
            assert component["port"] == listen_port(svc)
            health = (component.get("env") or {}).get("RSIGYM_HEALTH_PORT")
            assert health == env_of(svc)["RSIGYM_HEALTH_PORT"] == str(component["port"]), name
        data = "gymdata:/var/lib/rsigym" in (svc.get("volumes") or [])
        assert bool(component.get("dataVolume")) == data, f"{name}: shared data volume differs"
        assert bool(component.get("providerKeys")) == bool(svc.get("env_file")), f"{name}: provider keys differ"
        unconfined = "seccomp=unconfined" in (svc.get("security_opt") or [])
        assert bool(component.get("sandboxing")) == unconfined, f"{name}: sandboxing differs"
        for var, value in (component.get("env") or {}).items():
            if "{{" in str(value):
                continue  # rendered in the cluster (the gateway's in-cluster URL)
            assert str(value) == env_of(svc)[var], f"{name}: {var}={value!r} in helm, {env_of(svc)[var]!r} in compose"
    gpu = chart_values["workers"]["gpu"]
    assert gpu["gpus"] >= 1 and gpu["nodeSelector"] and gpu["tolerations"], "GPU workers: GPU nodes only"
    assert any(t.get("key") == "nvidia.com/gpu" for t in gpu["tolerations"])
    assert chart_values["workers"]["cpu"]["gpus"] == 0


def test_helm_secrets_come_from_kubernetes_secrets_and_only_where_needed(chart_values: dict[str, Any]) -> None:
    helm = helm_components(chart_values)
    for name, component in helm.items():
        for var, value in (component.get("env") or {}).items():
            assert not SECRET_VARS.search(var), f"{name}: {var} is a secret and must come from secretEnv"
            assert not any(p.search(str(value)) for p in SECRET_PATTERNS), f"{name}: {var}={value}"
        for var, ref in (component.get("secretEnv") or {}).items():
            assert ref in chart_values["secrets"], f"{name}: {var} -> secrets.{ref}, which does not exist"
    holders = {var: sorted(n for n, c in helm.items() if var in (c.get("secretEnv") or {}))
               for var in ("RSIGYM_ADMIN_TOKEN", "RSIGYM_METRICS_TOKEN", "RSIGYM_STORE_URL")}
    assert holders["RSIGYM_ADMIN_TOKEN"] == ["gateway"] and holders["RSIGYM_METRICS_TOKEN"] == ["gateway"]
    assert "rollout" not in holders["RSIGYM_STORE_URL"]
    assert [n for n, c in helm.items() if c.get("providerKeys")] == ["rollout"], "provider keys: rollout only"
    services_tpl = _templates()["services.yaml"]
    assert re.search(r"if \$svc\.providerKeys \}\}\s*envFrom:", services_tpl), "envFrom only under providerKeys"
    for name in ("gateway.yaml", "workers.yaml"):
        assert "envFrom" not in _templates()[name], f"{name}: provider keys go to rollout pods only"


def test_scraping_the_gateway_in_the_cluster(chart_values: dict[str, Any]) -> None:
    monitor = _templates()["servicemonitor.yaml"]
    assert "kind: ServiceMonitor" in monitor and "path: /metrics" in monitor
    assert ".Values.secrets.metrics.name" in monitor, "the ServiceMonitor authenticates with the scrape token"
    assert "prometheus.io/scrape" in _templates()["gateway.yaml"]
    assert chart_values["secrets"]["metrics"].get("optional") is True


def test_migration_job_runs_before_the_pods_roll(chart_values: dict[str, Any]) -> None:
    job = _templates()["migrate-job.yaml"]
    assert "helm.sh/hook: pre-install,pre-upgrade" in job and "kind: Job" in job
    assert "restartPolicy: Never" in job and "RSIGYM_STORE_URL" in job and "secretKeyRef" in job
    assert chart_values["migrations"]["enabled"] is True


def _migration_command() -> list[str]:
    lines = [ln for ln in _templates()["migrate-job.yaml"].splitlines() if not re.fullmatch(r"\s*\{\{.*\}\}\s*", ln)]
    job = yaml.safe_load(re.sub(r"\{\{.*?\}\}", "x", "\n".join(lines)))
    return job["spec"]["template"]["spec"]["containers"][0]["command"]


def test_the_migration_jobs_command_migrates_a_fresh_store(tmp_path: Path) -> None:
    """Runs the Job's exact command against an empty SQLite store: it must create the schema."""
    command = _migration_command()
    assert command == ["rsigym", "migrate"]
    env = {**os.environ, "RSIGYM_DATA_DIR": str(tmp_path)}
    env.pop("RSIGYM_STORE_URL", None)
    rsigym = Path(sys.executable).with_name("rsigym")  # the venv's console script, as the image installs it
    result = subprocess.run([str(rsigym), *command[1:]], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "store migrated" in result.stdout
    from sqlalchemy import create_engine, inspect

    engine = create_engine(f"sqlite:///{tmp_path / 'gym.sqlite3'}")
    tables = set(inspect(engine).get_table_names())
    engine.dispose()
    assert {"alembic_version", "keys"} <= tables or len(tables) > 5, f"no schema: {sorted(tables)}"


def test_the_migration_jobs_command_migrates_a_fresh_postgres_database(pg_available: bool) -> None:
    if not pg_available:
        pytest.skip("PostgreSQL not reachable (set CI=true to make this a failure)")
    from sqlalchemy import create_engine, inspect, text

    from tests.conftest import PG_URL

    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    db = f"deploy_{secrets.token_hex(5)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db}"'))
    try:
        url = PG_URL.rsplit("/", 1)[0] + f"/{db}"
        env = {**os.environ, "RSIGYM_STORE_URL": url}
        for _ in range(2):  # a second run (the next upgrade) finds nothing to do and still succeeds
            result = subprocess.run([str(Path(sys.executable).with_name("rsigym")), *_migration_command()[1:]], env=env, capture_output=True,
                                    text=True, timeout=300)
            assert result.returncode == 0, result.stderr[-2000:]
        engine = create_engine(url)
        with engine.connect() as conn:
            version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
            tables = set(inspect(conn).get_table_names())
        engine.dispose()
        heads = sorted(p.name.split("_")[0] for p in (ROOT / "storage/migrations/versions").glob("0*.py"))
        assert version == heads[-1], f"at {version}, newest migration {heads[-1]}"
        assert len(tables) > 5
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()


# ---- Helm chart, rendered (tests/deploy/helm_template.py: the chart's template subset, no helm binary) --

RELEASE = "prod"


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return manifests(render_chart(CHART, values, release=RELEASE))


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render()


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def component_of(resource_name: str) -> str:
    prefix = f"{RELEASE}-rsigym-"
    assert resource_name.startswith(prefix), resource_name
    return resource_name.removeprefix(prefix)


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {component_of(n): d["spec"]["template"]["metadata"]["labels"] for n, d in of_kind(docs, "Deployment").items()}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"selector form not checked here: {selector}"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_the_renderer_refuses_what_it_does_not_implement() -> None:
    """The rendered-chart tests are only as strict as the renderer: it must not guess."""
    with pytest.raises(TemplateError, match="lookup"):
        Renderer({"t": '{{ lookup "v1" "Secret" "ns" "x" }}'}).render("t", {})
    with pytest.raises(TemplateError, match="not closed"):
        Renderer({"t": "{{ if .a }}x"})
    with pytest.raises(TemplateError, match="required"):
        Renderer({"t": '{{ .a | required "a is needed" }}'}).render("t", {"a": ""})
    with pytest.raises(TemplateError, match="toYaml"):
        Renderer({"t": "{{ .a }}"}).render("t", {"a": {"b": 1}})
    out = Renderer({"t": '{{- range $k, $v := .m }} {{ $k }}={{ $v | quote }}{{ end -}}\n|{{ .m | toYaml | nindent 2 }}'})
    assert out.render("t", {"m": {"b": 2, "a": "x"}}) == ' a="x" b="2"|\n  a: x\n  b: 2'


def test_chart_renders_valid_objects_whose_selectors_hold(rendered: list[dict[str, Any]]) -> None:
    for doc in rendered:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], doc
        assert len(doc["metadata"]["name"]) <= 63
    kinds = [d["kind"] for d in rendered]
    assert kinds.count("Deployment") == 9 and kinds.count("Service") == 7
    assert {"ConfigMap", "PersistentVolumeClaim", "Job", "NetworkPolicy", "PodDisruptionBudget"} <= set(kinds)
    assert len({(d["kind"], d["metadata"]["name"]) for d in rendered}) == len(rendered), "duplicate objects"
    deployments = of_kind(rendered, "Deployment")
    for name, dep in deployments.items():
        pod = dep["spec"]["template"]
        assert selects(dep["spec"]["selector"], pod["metadata"]["labels"]), f"{name}: selector misses its pods"
        others = [n for n, d in deployments.items() if n != name and selects(dep["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        assert not others, f"{name}: its selector also matches {others}"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True and pod["spec"]["automountServiceAccountToken"] is False
        container = container_of(dep)
        assert container["resources"]["requests"] and container["resources"]["limits"], f"{name}: resources"
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        mounts = {m["name"] for m in container["volumeMounts"]}
        assert mounts <= {v["name"] for v in pod["spec"]["volumes"]}, f"{name}: mounts an undeclared volume"
    for name, svc in of_kind(rendered, "Service").items():
        backing = [n for n, d in deployments.items() if selects({"matchLabels": svc["spec"]["selector"]}, d["spec"]["template"]["metadata"]["labels"])]
        assert backing == [name], f"Service {name} selects {backing}"
        ports = {p["name"] for p in container_of(deployments[name]).get("ports", [])}
        assert all(p["targetPort"] in ports for p in svc["spec"]["ports"])
    config = of_kind(rendered, "ConfigMap")[f"{RELEASE}-rsigym-config"]
    assert "rollout" in tomllib.loads(config["data"]["gym.toml"])
    claim = of_kind(rendered, "PersistentVolumeClaim")[f"{RELEASE}-rsigym-data"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_rendered_helm_and_compose_run_the_same_components_with_the_same_environment(
        rendered: list[dict[str, Any]], services: dict[str, dict[str, Any]], chart_values: dict[str, Any]) -> None:
    """The acceptance check on what the chart really renders: per component the same environment
    variable names as compose, the same command, image role, data volume, provider keys, sandboxing."""
    deployments = {component_of(n): d for n, d in of_kind(rendered, "Deployment").items()}
    compose_parts = rsigym_services(services)
    assert set(deployments) == set(compose_parts)
    svc_ports = {component_of(n): s["spec"]["ports"][0]["port"] for n, s in of_kind(rendered, "Service").items()}
    secrets_ = {(s["name"], s["key"]) for s in chart_values["secrets"].values()}
    for name, dep in deployments.items():
        compose_svc, container = compose_parts[name], container_of(dep)
        env = {e["name"]: e for e in container.get("env") or []}
        assert len(env) == len(container.get("env") or []), f"{name}: an env var is set twice"
        assert set(env) == set(env_of(compose_svc)), (f"{name}: env only in compose {sorted(set(env_of(compose_svc)) - set(env))}, "
                                                      f"only in helm {sorted(set(env) - set(env_of(compose_svc)))}")
        for var, entry in env.items():
            if SECRET_VARS.search(var):
                ref = entry["valueFrom"]["secretKeyRef"]
                assert (ref["name"], ref["key"]) in secrets_, f"{name}: {var} from an unknown Secret"
            else:
                assert "value" in entry and not any(p.search(entry["value"]) for p in SECRET_PATTERNS), f"{name}: {var}"
        gateway_url = urlsplit(env["RSIGYM_GATEWAY_URL"]["value"])
        assert component_of(gateway_url.hostname) == "gateway" and gateway_url.port == svc_ports["gateway"]
        args, cmd = container["args"], command_of(compose_svc)
        assert_real_rsigym_command(f"helm {name}", args)
        if name == "gateway":
            helm_wired = {k: (component_of(urlsplit(u).hostname), urlsplit(u).port)
                          for k, u in (s.split("=", 1) for s in option(args, "--service"))}
            compose_wired = {k: (urlsplit(u).hostname, urlsplit(u).port)
                             for k, u in (s.split("=", 1) for s in option(cmd, "--service"))}
            assert helm_wired == compose_wired == {k: (k, svc_ports[k]) for k in SERVICES}
            args = [a for a in args if a != "--service" and a not in option(args, "--service")]
            cmd = [a for a in cmd if a != "--service" and a not in option(cmd, "--service")]
        assert args == cmd, f"{name}: helm runs {args}, compose {cmd}"
        repo, _, tag = container["image"].rpartition(":")
        assert repo == f"rsigym-{target_of(compose_svc)}" and tag, f"{name}: image {container['image']}"
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        on_claim = "persistentVolumeClaim" in volumes["data"]
        assert on_claim == ("gymdata:/var/lib/rsigym" in (compose_svc.get("volumes") or [])), f"{name}: data volume"
        assert ("envFrom" in container) == bool(compose_svc.get("env_file")), f"{name}: provider keys"
        unconfined = container["securityContext"].get("seccompProfile", {}).get("type") == "Unconfined"
        assert unconfined == ("seccomp=unconfined" in (compose_svc.get("security_opt") or [])), f"{name}: sandboxing"
        if name in svc_ports:
            assert svc_ports[name] == listen_port(compose_svc)


def test_rendered_gpu_worker_asks_for_a_gpu_on_gpu_nodes(rendered: list[dict[str, Any]]) -> None:
    deployments = {component_of(n): d for n, d in of_kind(rendered, "Deployment").items()}
    gpu = deployments["worker-gpu"]["spec"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in gpu["tolerations"])
    for name, dep in deployments.items():
        if name != "worker-gpu":
            assert "nvidia.com/gpu" not in json.dumps(dep), f"{name} must not claim a GPU"


def _policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {component_of(n): d["spec"] for n, d in of_kind(docs, "NetworkPolicy").items()}


def _peers(rule: dict[str, Any], pods: dict[str, dict[str, str]], key: str) -> set[str]:
    """The rsigym pods a rule's peers select (a peer with no podSelector is outside the release)."""
    return {name for peer in rule.get(key, []) if "podSelector" in peer for name, labels in pods.items()
            if selects(peer["podSelector"], labels)}


def test_rendered_network_policies_confine_agents_services_and_workers(rendered: list[dict[str, Any]]) -> None:
    pods = pod_labels(rendered)
    pods_and_agent = {**pods, "agent": {"rsigym/role": "agent"}}
    policies = _policies(rendered)
    gateway_port = svc_port = None
    for name, dep in of_kind(rendered, "Deployment").items():
        if component_of(name) == "gateway":
            gateway_port = container_of(dep)["ports"][0]["containerPort"]
    # Agents: egress to the gateway pods on the gateway port, and DNS; nothing else; no ingress at
    # all (no other run's agent connects to one).
    agent = policies["agent-egress"]
    assert {n for n, labels in pods_and_agent.items() if selects(agent["podSelector"], labels)} == {"agent"}
    assert agent["policyTypes"] == ["Ingress", "Egress"] and agent["ingress"] == []
    to_pods = [_peers(rule, pods, "to") for rule in agent["egress"]]
    assert {"gateway"} in to_pods and all(p in ({"gateway"}, set()) for p in to_pods)
    for rule in agent["egress"]:
        if _peers(rule, pods, "to"):
            assert [p["port"] for p in rule["ports"]] == [gateway_port]
        else:
            assert {p["port"] for p in rule["ports"]} == {53} and "namespaceSelector" in rule["to"][0]
    # Services: ingress from the gateway pods only, on the service's own port.
    for service in SERVICES:
        policy = policies[f"{service}-ingress"]
        assert {n for n, labels in pods_and_agent.items() if selects(policy["podSelector"], labels)} == {service}
        assert policy["policyTypes"] == ["Ingress"] and len(policy["ingress"]) == 1
        rule = policy["ingress"][0]
        assert _peers(rule, pods_and_agent, "from") == {"gateway"} and len(rule["from"]) == 1
        svc_port = container_of(of_kind(rendered, "Deployment")[f"{RELEASE}-rsigym-{service}"])["ports"][0]["containerPort"]
        assert [p["port"] for p in rule["ports"]] == [svc_port]
    # Workers: no ingress; egress to the gateway, the store and redis ports, DNS.
    workers = policies["workers"]
    assert {n for n, labels in pods_and_agent.items() if selects(workers["podSelector"], labels)} == {"worker-cpu", "worker-gpu"}
    assert workers["policyTypes"] == ["Ingress", "Egress"] and workers["ingress"] == []
    egress_ports = {p["port"] for rule in workers["egress"] for p in rule["ports"]}
    assert egress_ports == {gateway_port, 5432, 6379, 53}
    assert [_peers(r, pods, "to") for r in workers["egress"] if _peers(r, pods, "to")] == [{"gateway"}]


def test_rendered_options_autoscaling_service_monitor_store_peers_existing_claim(chart_values: dict[str, Any]) -> None:
    values = json.loads(json.dumps(chart_values))
    values["gateway"]["autoscaling"]["enabled"] = True
    values["metrics"]["serviceMonitor"]["enabled"] = True
    values["networkPolicy"]["storeTo"] = [{"ipBlock": {"cidr": "10.0.5.0/24"}}]
    values["data"]["existingClaim"] = "lab-nfs"
    values["workers"]["gpu"]["enabled"] = False
    values["migrations"]["enabled"] = False
    docs = render(values)
    hpa = of_kind(docs, "HorizontalPodAutoscaler")[f"{RELEASE}-rsigym-gateway"]
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["scaleTargetRef"]["name"] == f"{RELEASE}-rsigym-gateway"
    assert "replicas" not in of_kind(docs, "Deployment")[f"{RELEASE}-rsigym-gateway"]["spec"], "the HPA owns replicas"
    monitor = of_kind(docs, "ServiceMonitor")[f"{RELEASE}-rsigym-gateway"]
    auth = monitor["spec"]["endpoints"][0]["authorization"]["credentials"]
    assert (auth["name"], auth["key"]) == (chart_values["secrets"]["metrics"]["name"], chart_values["secrets"]["metrics"]["key"])
    gateway_svc = of_kind(docs, "Service")[f"{RELEASE}-rsigym-gateway"]
    assert selects(monitor["spec"]["selector"], gateway_svc["metadata"]["labels"])
    store_rule = next(r for r in _policies(docs)["workers"]["egress"] if {p["port"] for p in r["ports"]} == {5432, 6379})
    assert store_rule["to"] == [{"ipBlock": {"cidr": "10.0.5.0/24"}}]
    assert not of_kind(docs, "PersistentVolumeClaim") and not of_kind(docs, "Job")
    claims = {v["persistentVolumeClaim"]["claimName"] for d in of_kind(docs, "Deployment").values()
              for v in d["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"lab-nfs"}
    assert f"{RELEASE}-rsigym-worker-gpu" not in of_kind(docs, "Deployment")
    default = render()
    assert "replicas" in of_kind(default, "Deployment")[f"{RELEASE}-rsigym-gateway"]["spec"]
    assert not of_kind(default, "ServiceMonitor") and not of_kind(default, "HorizontalPodAutoscaler")


def test_rendered_migration_job_is_a_pre_install_hook_with_only_the_store_secret(rendered: list[dict[str, Any]]) -> None:
    job = of_kind(rendered, "Job")[f"{RELEASE}-rsigym-migrate"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert env == {"RSIGYM_STORE_URL", "PGPASSWORD"}, "the migration needs the store and nothing else"
    assert pod["containers"][0]["command"] == _migration_command()


# ---- Prometheus alert rules and the Grafana dashboard ----------------------------------------------


@pytest.fixture(scope="module")
def metrics() -> dict[str, set[str]]:
    return registered_metrics()


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_the_metric_registry_reader_sees_the_gateway_metrics(metrics: dict[str, set[str]]) -> None:
    """The reference the next tests check against is real (and would miss a renamed metric)."""
    assert metrics["rsigym_refusals_total"] == {"reason"}
    assert metrics["rsigym_request_seconds_bucket"] == {"service", "le"}
    assert {"service", "operation", "status"} == metrics["rsigym_requests_total"]
    assert "rsigym_refusals" not in metrics and "rsigym_spend_usd_total" in metrics


def test_alert_rules_cover_the_issue_and_reference_registered_metrics(metrics: dict[str, set[str]]) -> None:
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert {"RSIGymBudgetExhaustion", "RSIGymRefusalSpike", "RSIGymJobFailures", "RSIGymQueueAge",
            "RSIGymSettlementOverrun"} <= names
    covered = set()
    for rule in rules:
        expr = rule["expr"]
        used = promql_metrics(expr)
        assert used or "up{" in expr, f"{rule['alert']}: names no rsigym metric"
        unknown = used - set(metrics)
        assert not unknown, f"{rule['alert']}: {sorted(unknown)} are not registered by the code"
        known_labels = set().union(*(metrics[m] for m in used)) if used else {"job", "instance"}
        assert promql_grouping_labels(expr) <= known_labels, f"{rule['alert']}: groups by a label the metrics lack"
        for metric, label, _, _ in promql_matchers(expr):
            assert label in metrics[metric], f"{rule['alert']}: {metric} has no label {label}"
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"]
        covered |= used
    assert {"rsigym_refusals_total", "rsigym_jobs_finished_total", "rsigym_queue_oldest_age_seconds",
            "rsigym_provider_overrun_usd_total"} <= covered


def test_alert_label_values_are_ones_the_code_emits() -> None:
    """reason= values are error types of kit/errors.py (what the gateway counts);
    status= values are job final states; outcome= values are the reservation outcomes gateway/metrics.py
    declares (the children gateway/proxy.py counts on)."""
    error_types = {cls.type for cls in vars(gym_errors).values()
                   if isinstance(cls, type) and issubclass(cls, gym_errors.GymError)}
    final_states = set()
    for module in ("services/training/jobs.py", "services/evaluation/jobs.py"):
        final_states |= set(re.findall(r"\"([a-z_]+)\"", re.search(r"FINAL = \{([^}]*)\}", (ROOT / module).read_text())[1]))
    outcomes = set(re.findall(r"_child\(\"reservations\",\s*\"([a-z_]+)\"\)", (ROOT / "gateway/metrics.py").read_text()))
    assert "budget_exhausted" in error_types and "failed" in final_states and {"settled", "released"} <= outcomes
    allowed = {"reason": error_types, "status": final_states, "outcome": outcomes}
    queries = [r["expr"] for r in alert_rules()] + [e for _, e in dashboard_queries()]
    seen = set()
    for expr in queries:
        for metric, label, op, value in promql_matchers(expr):
            if label not in allowed:
                continue
            values = value.split("|") if op in ("=~", "!~") else [value]
            for v in values:
                assert v in allowed[label], f"{metric}{{{label}{op}{value!r}}}: {v!r} is never emitted"
                seen.add((label, v))
    assert ("reason", "budget_exhausted") in seen and ("status", "failed") in seen


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("promtool is required in CI (Debian package prometheus; `make install` installs it)")
        pytest.skip("promtool not installed (Debian package prometheus); the rules were parsed without it")
    return tool


def test_promtool_checks_the_rules_and_their_unit_tests() -> None:
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in check.stdout
    test = subprocess.run([promtool, "test", "rules", ALERTS_TEST.name], cwd=ALERTS_TEST.parent,
                          capture_output=True, text=True, timeout=120)
    assert test.returncode == 0, test.stdout + test.stderr
    tested = {case["alertname"] for t in yaml.safe_load(ALERTS_TEST.read_text())["tests"] for case in t["alert_rule_test"]}
    assert tested == {r["alert"] for r in alert_rules()}, "every alert has a promtool unit test"


def test_promtool_accepts_the_scrape_config(tmp_path: Path) -> None:
    promtool = _promtool()
    cfg = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    token = tmp_path / "metrics-token"
    token.write_text("scrape-token\n")
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    cfg["rule_files"] = ["alerts.yml"]
    for job in cfg["scrape_configs"]:
        job["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    check = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_grafana_dashboard_parses_and_queries_registered_metrics(metrics: dict[str, set[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells = set()
    for panel in panels:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, f"{panel['title']}: off the grid"
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["targets"], f"{panel['title']}: no query"
            assert panel["datasource"]["uid"] == "${datasource}"
    queries = dashboard_queries()
    used = set()
    for title, expr in queries:
        names = promql_metrics(expr)
        assert names, f"{title}: no rsigym metric in {expr}"
        assert not names - set(metrics), f"{title}: {sorted(names - set(metrics))} are not registered by the code"
        known = set().union(*(metrics[m] for m in names))
        assert promql_grouping_labels(expr) <= known, f"{title}: groups by a label the metrics lack: {expr}"
        used |= names
    assert {"rsigym_spend_usd_total", "rsigym_requests_total", "rsigym_refusals_total", "rsigym_request_seconds_bucket",
            "rsigym_queue_depth", "rsigym_queue_oldest_age_seconds", "rsigym_jobs_finished_total",
            "rsigym_provider_overrun_usd_total"} <= used
    assert any("histogram_quantile(0.99" in e for _, e in queries), "latency quantiles"
    assert any("sum by (service)" in e and "rsigym_spend_usd_total" in e for _, e in queries), "spend per service"


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Grafana's $__ variables replaced by a range, each query becomes a recording rule that
    promtool parses: a typo in PromQL fails here, not on a blank panel."""
    promtool = _promtool()
    rules = [{"record": f"rsigym:dashboard_query_{i}", "expr": re.sub(r"\$__\w+", "5m", expr)}
             for i, (_, expr) in enumerate(dashboard_queries())]
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([promtool, "check", "rules", str(tmp_path / "queries.yml")], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_agent_image_installs_the_clis_at_the_launchers_pins_and_the_sdk_with_its_mcp_server() -> None:
    from ops.launcher import load_agents

    dockerfile = (ROOT / "agent_container" / "Dockerfile").read_text()
    pins = sorted(spec for t in load_agents().values() for spec in t.npm)
    assert pins == ["@anthropic-ai/claude-code@2.1.332", "@openai/codex@0.171.0"]
    installed = re.search(r"npm install -g [^\n]*", dockerfile)
    assert installed is not None and sorted(p for p in installed.group(0).split() if "@" in p) == pins
    assert '"/tmp/rsigym-sdk[mcp,clients]"' in dockerfile  # `gym mcp` in the image


def test_compose_mode_mounts_a_clis_setup_and_the_entrypoint_copies_it_into_home(tmp_path: Path) -> None:
    from ops.launcher_compose import SETUP_INSIDE, ComposeTarget, run_compose_file

    (tmp_path / "instruction.md").write_text("x")
    spec = run_compose_file(ComposeTarget(file=ROOT / "docker-compose.yml", project_dir=ROOT), run="key_abc",
                            track="joint", run_dir=tmp_path, egress=False, env={"DISABLE_AUTOUPDATER": "1"},
                            setup=True)
    agent = spec["services"]["agent"]
    assert f"{(tmp_path / 'setup').resolve()}:{SETUP_INSIDE}:ro" in agent["volumes"]
    assert agent["environment"]["DISABLE_AUTOUPDATER"] == "1"
    assert "RSIGYM_API_KEY" not in agent["environment"]  # the key stays in the docker CLI's environment
    entrypoint = (ROOT / "agent_container" / "entrypoint.sh").read_text()
    assert f'cp -R {SETUP_INSIDE}/. "$HOME"/' in entrypoint
