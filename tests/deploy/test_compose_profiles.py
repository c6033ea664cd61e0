"""docker-compose.yml, launched profile by profile without a Docker engine (issue 12, item 8).

For every profile the compose file uses, exactly what that profile activates is started as local
processes (tests/deploy/compose_local.py: each part's image entrypoint, compose's command and
environment, ``.env`` filled as .env.example asks; host names, volumes and the two stores mapped)
and a short flow runs through it:

* every profile: /healthz of the gateway and of the six services (the gateway reports each one
  wired), the Celery worker(s) answer a ping on the queues compose gives them, the admin token
  mints a key of the profile's track (joint for gpu, cloud and ops), one metered inference call
  goes through the gateway and its ledger row is settled;
* joint: one small training job (the tiny local model, a few steps) runs on worker-cpu — the
  store records that worker as the job's holder — and settles. The other profiles only prove the
  worker consumes its queues (a ping and its active queues): the same job in every profile would
  cost minutes of CPU and prove nothing more about the wiring;
* track profiles (data, harness, joint, offline): agent-<track> runs through its image's
  entrypoint (agent_container/entrypoint.sh: the ``gym balance`` smoke check) a short SDK script
  that reads the balance, reaches the agent route and is refused what its track revokes; its
  environment holds no platform secret;
* gpu: worker-gpu, with its compose command and environment, consumes training-gpu here on CPU
  (the CUDA image only adds the runtime; the queue wiring is what is tested);
* ops: Prometheus (Debian's ``prometheus`` package) runs deploy/prometheus.yml, targets mapped,
  with the scrape token file .env.example describes, and reports the gateway target up. Grafana is
  not packaged for Debian, so it is not launched: its provisioning (datasource, dashboard) is
  checked statically in tests/deploy/test_deploy_static.py.

Redis is the test database (13) with a queue prefix of its own per test, so parallel test runs do
not consume each other's jobs; that prefix (RSIGYM_WORKER_QUEUE_PREFIX) is the only variable added
to what compose declares.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import create_engine, select, text

from kit.config import SMOLLM2, load_config, smollm2_installed
from kit.settings import WorkerSettings
from ops.builder import SERVICES
from services.training.tables import TrainingJob
from services.worker.celery_app import make_celery
from tests.conftest import IN_CI, MODELS_DIR, PG_URL, require_redis
from tests.deploy.compose_local import ROOT, LocalCompose, command_of, dockerfile_of, load_compose, option, profiles_of
from tests.deploy.test_deploy_static import alert_rules, promql_metrics

pytestmark = pytest.mark.slow

COMPOSE = load_compose()["services"]
PROFILES = profiles_of(COMPOSE)
TRACKS = ("data", "harness", "joint", "offline")
REDIS_TEST_URL = os.environ.get("RSIGYM_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
PLATFORM_VARS = re.compile(r"INTERNAL_SECRET|ADMIN_TOKEN|METRICS_TOKEN|STORE_URL|REDIS_URL|BROKER_URL|PASSWORD|PGPASS")

# Run inside agent-<track> (`docker compose run agent-<track> python3 -c …`), with the SDK only.
AGENT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import httpx
    from rsigym import APIStatusError, Gym

    track = sys.argv[1]
    gym = Gym()
    out = {"env": dict(os.environ), "balance": gym.balance().model_dump(mode="json")}

    def status(call):
        try:
            call()
        except APIStatusError as err:
            return [err.status_code, err.type]
        return [200, None]

    ask = [{"role": "user", "content": "hi"}]
    train = dict(datasets=["ds_none"], base_model="tiny", steps=3, batch_size=2)
    if track == "harness":
        out["training"] = status(lambda: gym.training.create_job(**train))
        out["rollout"] = status(lambda: gym.rollout.chat(model="teacher", messages=ask, max_tokens=1))
    elif track == "data":
        out["learning_rate"] = status(lambda: gym.training.create_job(**train, learning_rate=0.5))
        out["parent_checkpoint"] = status(lambda: gym.training.create_job(**train, parent_checkpoint="ckpt_x"))
    elif track == "joint":
        out["other_base"] = status(lambda: gym.training.create_job(**{**train, "base_model": "not-the-base"}))
    elif track == "offline":
        out["other_teacher"] = status(lambda: gym.rollout.chat(model="judge", messages=ask, max_tokens=1))
    models = httpx.get(os.environ["RSIGYM_URL"] + "/agent/v1/models",
                       headers={"Authorization": "Bearer " + os.environ["RSIGYM_API_KEY"]})
    out["agent_route"] = models.status_code
    print("AGENT-RESULT " + json.dumps(out))
""")
REVOKED = {
    "harness": {"training": 403, "rollout": 403},
    "data": {"learning_rate": 403, "parent_checkpoint": 403},
    "joint": {"other_base": 403},
    "offline": {"other_teacher": 403},
}
"""What each track's preset refuses (access/presets/*.toml), as the agent sees it."""


@pytest.fixture
def redis_test_url() -> str:
    return require_redis(REDIS_TEST_URL)


@pytest.fixture
def launched(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str, redis_test_url: str) -> Iterator[LocalCompose]:
    profile = request.param
    prefix = f"t{secrets.token_hex(4)}."
    token_file = tmp_path / "metrics-token"
    token_file.write_text("scrape-" + secrets.token_urlsafe(16))
    token_file.chmod(0o600)
    dotenv = {  # .env as .env.example asks: the three required secrets, the optional scrape token
        "RSIGYM_INTERNAL_SECRET": secrets.token_urlsafe(32), "RSIGYM_ADMIN_TOKEN": secrets.token_urlsafe(32),
        "POSTGRES_PASSWORD": "trust-auth-ignores-it", "RSIGYM_METRICS_TOKEN": token_file.read_text(),
        "RSIGYM_METRICS_TOKEN_FILE": str(token_file),
    }
    local = LocalCompose(profile, tmp_path, dotenv, store_url=f"{PG_URL}?options=-csearch_path%3D{pg_schema}",
                         redis_url=redis_test_url, extra_env={"RSIGYM_WORKER_QUEUE_PREFIX": prefix})
    # The shared data volume already holds the tiny base model (built once per machine, as an
    # operator would build it once into the volume).
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    gymdata = local.tmp / "volumes" / "gymdata"
    gymdata.mkdir(parents=True, exist_ok=True)
    (gymdata / "models").symlink_to(MODELS_DIR, target_is_directory=True)
    try:
        yield local
    finally:
        local.stop()
        _forget_queues(redis_test_url, prefix)


def _forget_queues(redis_url: str, prefix: str) -> None:
    r = redis.Redis.from_url(redis_url)
    for pattern in (f"{prefix}*", f"_kombu.binding.{prefix}*"):
        for name in r.scan_iter(match=pattern):
            r.delete(name)


def _track_of(profile: str) -> str:
    return profile if profile in TRACKS else "joint"


def _platform_parts(local: LocalCompose) -> tuple[list[str], list[str]]:
    """(served parts, Celery workers) of the profile: every service built from deploy/Dockerfile."""
    built = [n for n, s in local.services.items() if dockerfile_of(s) == "deploy/Dockerfile"]
    served = [n for n in built if command_of(local.services[n])[:1] == ["serve"]]
    workers = [n for n in built if command_of(local.services[n])[:1] == ["worker"]]
    assert set(built) == set(served) | set(workers)
    return served, workers


def _worker_answers(local: LocalCompose, name: str) -> set[str]:
    """The queues the worker ``name`` consumes, once it answers a Celery ping."""
    app = make_celery(WorkerSettings(broker_url=local.redis_url))[0]
    hostname = f"rsigym-{local.procs[name].pid}@{os.uname().nodename}"

    def ping() -> bool:
        return any(hostname in reply for reply in app.control.ping(destination=[hostname], timeout=1.0))
    local.until(f"{name} answers a Celery ping", ping, timeout=240, watch=(name,))
    active = app.control.inspect(destination=[hostname], timeout=5.0).active_queues() or {}
    return {q["name"] for q in active.get(hostname, [])}


def _start_prometheus(local: LocalCompose) -> str:
    """Prometheus as the compose service runs it: deploy/prometheus.yml and the files compose mounts,
    container paths and the gateway's host name mapped."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        if IN_CI:
            pytest.fail("prometheus (Debian package prometheus, installed by `make install`) is missing")
        pytest.skip("prometheus is not installed (apt-get install --no-install-recommends prometheus)")
    mounts = local.mounts("prometheus")
    config_source = mounts.pop("/etc/prometheus/prometheus.yml")
    data = mounts.pop("/prometheus")
    config = config_source.read_text()
    for target, source in mounts.items():
        config = config.replace(target, str(source))
    config = config.replace("gateway:8700", f"127.0.0.1:{local.ports['gateway']}")
    mapped = local.tmp / "prometheus.yml"
    mapped.write_text(config)
    local.start_raw("prometheus", [prometheus, f"--config.file={mapped}", f"--storage.tsdb.path={data}",
                                   f"--web.listen-address=127.0.0.1:{local.ports['prometheus']}"],
                    env={"PATH": "/usr/bin:/bin", "HOME": str(local.tmp)})
    return local.url("prometheus")


@pytest.mark.parametrize("launched", PROFILES, indirect=True)
def test_each_profile_runs_what_compose_declares(launched: LocalCompose) -> None:
    local, profile = launched, launched.profile
    if "gateway" not in local.services:  # an add-on profile, used with a track's (egress)
        _addon_profile(local)
        return
    track = _track_of(profile)
    served, workers = _platform_parts(local)
    assert {"postgres", "redis", "gateway", *SERVICES} <= set(local.services)
    agent = f"agent-{profile}"
    assert (agent in local.services) == (profile in TRACKS)
    assert ("worker-gpu" in workers) == (profile == "gpu") and "worker-cpu" in workers

    for name in [*served, *workers]:
        local.start(name)
    prom_url = _start_prometheus(local) if "prometheus" in local.services else None

    # Every served part answers /healthz; the gateway forwards to all six services.
    for name in served:
        health = local.healthz(name)
        if name != "gateway":
            assert health["service"] == command_of(local.services[name])[1]
    assert sorted(local.healthz("gateway")["services"]) == sorted(SERVICES)
    # The workers consume the queues compose names (under the test's prefix).
    prefix = local.extra_env["RSIGYM_WORKER_QUEUE_PREFIX"]
    for name in workers:
        expected = {prefix + q for q in option(command_of(local.services[name]), "--queues")[0].split(",")}
        assert _worker_answers(local, name) == expected

    gateway = httpx.Client(base_url=local.url("gateway"), timeout=120)
    admin = {"Authorization": f"Bearer {local.dotenv['RSIGYM_ADMIN_TOKEN']}"}
    created = gateway.post("/admin/v1/keys", headers=admin,
                           json={"track": track, "budget_usd": 5.0, "agent_budget_usd": 1.0})
    assert created.status_code == 201, created.text
    run = created.json()
    assert run["track"] == ("joint+offline" if track == "offline" else track)  # offline alone: joint + offline
    run_auth = {"Authorization": f"Bearer {run['key']}"}
    # A service refuses the run key straight (only gateway-signed calls pass).
    assert httpx.get(f"{local.url('inference')}/v1/models", headers=run_auth, timeout=10).status_code == 401

    # One metered call through the gateway, settled in the ledger (on the track's model: the harness
    # track's is SmolLM2-135M-Instruct where make install installed it, kit/config.py).
    model = SMOLLM2 if track == "harness" and smollm2_installed() else "tiny"
    reply = gateway.post("/inference/v1/chat/completions", headers=run_auth,
                         json={"model": model, "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert float(reply.headers["X-RSIGym-Cost-USD"]) > 0
    rows = gateway.get(f"/admin/v1/keys/{run['id']}/ledger", headers=admin).json()["data"]
    assert [(r["service"], r["status"]) for r in rows] == [("inference", "settled")]
    assert rows[0]["actual_usd"] == pytest.approx(float(reply.headers["X-RSIGym-Cost-USD"]))

    # The rollout catalogue is the mounted gym config's; /metrics answers the scrape token, not a wrong one.
    models = gateway.get("/rollout/v1/models", headers=run_auth)
    if track == "harness":
        assert models.status_code == 403, models.text  # the harness track is not granted rollout
    else:
        assert models.status_code == 200, models.text
        offered = {m.name for m in load_config(ROOT / "deploy" / "gym.example.toml").rollout.models}
        assert {m["id"] for m in models.json()["data"]} <= offered and models.json()["data"]
    assert gateway.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code in (401, 403)
    scraped = gateway.get("/metrics", headers={"Authorization": f"Bearer {local.dotenv['RSIGYM_METRICS_TOKEN']}"})
    assert scraped.status_code == 200 and "# TYPE " in scraped.text

    if profile == "joint":
        _training_job_runs_on_worker_cpu(local, gateway, run, admin)
    if agent in local.services:
        _agent_container(local, agent, run, track)
    if prom_url is not None:
        _prometheus_scrapes_the_gateway(local, prom_url, scraped.text)


def _addon_profile(local: LocalCompose) -> None:
    """A profile without the core (``egress``: the run launcher starts it beside a track's agent): each
    of its parts starts with its compose command and environment and listens on its port; an
    egress proxy with the empty allowlist compose defaults to refuses every host."""
    import socket

    parts = [n for n, s in local.services.items() if dockerfile_of(s)]
    assert parts, f"profile {local.profile} starts nothing this repository builds"
    for name in parts:
        local.start(name)
    for name in parts:
        port = local.ports[name]

        def listening(port: int = port) -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0
        local.until(f"{name} listens", listening, timeout=120, watch=(name,))
        if command_of(local.services[name])[:1] == ["egress-proxy"]:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
                head = sock.recv(4096).decode(errors="replace")
            assert head.startswith("HTTP/1.1 403"), head


def _training_job_runs_on_worker_cpu(local: LocalCompose, gateway: httpx.Client, run: dict[str, Any],
                                     admin: dict[str, str]) -> None:
    import rsigym

    gym = rsigym.Gym(base_url=local.url("gateway"), api_key=run["key"], timeout=120)
    rows = [{"messages": [{"role": "user", "content": f"{i}-1="}, {"role": "assistant", "content": str(i - 1)}]}
            for i in range(2, 10)]
    dataset = gym.training.upload_dataset(rows, name="minus-one")
    job = gym.training.create_job(datasets=[dataset.id], base_model="tiny", steps=3, batch_size=2, max_length=32,
                                  seed=1)
    done = gym.training.wait(job.id, timeout=300, poll=1)
    assert done.status == "succeeded", (done.status, done.error, local.log("worker-cpu"))
    assert done.checkpoints, "the job wrote no checkpoint"
    engine = create_engine(local.store_url)
    try:
        with engine.connect() as conn:
            holder = conn.execute(select(TrainingJob.worker).where(TrainingJob.id == job.id)).scalar_one()
            assert conn.execute(text("SELECT current_schema()")).scalar_one() in local.store_url
    finally:
        engine.dispose()
    assert holder is not None and int(holder.split(":")[1]) == local.procs["worker-cpu"].pid, holder
    ledger = gateway.get(f"/admin/v1/keys/{run['id']}/ledger", headers=admin).json()["data"]
    training = [r for r in ledger if r["service"] == "training"]
    assert training and {r["status"] for r in training} == {"settled"}, ledger
    assert all(r["status"] == "settled" for r in ledger)


def _agent_container(local: LocalCompose, agent: str, run: dict[str, Any], track: str) -> None:
    """agent-<track> through its entrypoint, with RSIGYM_API_KEY exported as the compose header says."""
    local.dotenv["RSIGYM_API_KEY"] = run["key"]
    local.start(agent, ["python3", "-c", AGENT_SCRIPT, track])
    assert local.wait(agent, timeout=180) == 0, local.log(agent)
    line = next(ln for ln in local.log(agent).splitlines() if ln.startswith("AGENT-RESULT "))
    result = json.loads(line.removeprefix("AGENT-RESULT "))
    env: dict[str, str] = result["env"]
    assert env["RSIGYM_URL"] == local.url("gateway") and env["RSIGYM_API_KEY"] == run["key"]
    assert result["balance"]["budget_usd"] == pytest.approx(5.0)
    # No platform secret reached the agent: neither by name nor by value.
    assert not [k for k in env if PLATFORM_VARS.search(k)], sorted(env)
    values = "\n".join(env.values())
    for secret in (*[v for k, v in local.dotenv.items() if k != "RSIGYM_API_KEY"], local.store_url, local.redis_url):
        assert secret not in values
    # The only key it holds is the run key (the entrypoint hands it to the OpenAI SDK as well).
    assert {v for k, v in env.items() if k.endswith("_API_KEY")} == {run["key"]}
    for what, expected in REVOKED[track].items():
        assert result[what][0] == expected, (what, result[what])
    assert result["agent_route"] == 200  # /agent/v1 reaches the rollout service through the gateway


def _prometheus_scrapes_the_gateway(local: LocalCompose, prom_url: str, metrics_text: str) -> None:
    def gateway_up() -> bool:
        try:
            targets = httpx.get(f"{prom_url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return any(t["labels"].get("component") == "gateway" and t["health"] == "up" for t in targets)
    local.until("Prometheus reports the gateway target up", gateway_up, timeout=90, poll=1, watch=("prometheus",))
    groups = httpx.get(f"{prom_url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    assert loaded == {rule["alert"] for rule in alert_rules()}, "the alert rules compose mounts were not loaded"
    # Every metric the alerts name is on the gateway's live /metrics (families, sampled or not yet).
    families = set(re.findall(r"^# TYPE (\S+) ", metrics_text, re.M))
    for rule in alert_rules():
        for metric in promql_metrics(rule["expr"]):
            base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
            assert base in families or metric in families, f"{rule['alert']}: {metric} is not on a live /metrics"
