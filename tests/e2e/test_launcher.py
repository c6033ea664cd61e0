"""``rsigym run start`` in embedded mode: the scripted agent, in its namespaces, sees only its
environment and reaches only the gateway (not the store, not another loopback port, not the data dir)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from ops.cli.main import app as operator_cli
from ops.tasks import TASKS
from services.training.tables import TrainingJob
from tests.conftest import ADMIN_TOKEN, admin_headers, bearer, client_for, require_bwrap
from tests.e2e.test_agent_route import agent_config
from tests.fakes.servers import serve_gym

EXPECTED_ENV = sorted(["RSIGYM_URL", "RSIGYM_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL",
                       "ANTHROPIC_API_KEY", "PATH", "HOME", "RSIGYM_INSTRUCTION"])


@pytest.fixture
def live(make_gym: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    require_bwrap()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    gym = make_gym()
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        monkeypatch.setenv("RSIGYM_DATA_DIR", str(data_dir))
        yield url, data_dir


def rsigym(*args: str) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result.stdout


def wait_for_exit(run: str, *, tries: int) -> dict[str, Any]:
    """``run show`` every 0.1 s until the run is no longer running (or ``tries`` run out)."""
    for _ in range(tries):
        shown: dict[str, Any] = rsigym("run", "show", run, "--json")
        if shown["status"] != "running":
            break
        time.sleep(0.1)
    return shown


def report(log: str) -> dict[str, Any]:
    out = {}
    for line in log.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name.isidentifier():
            try:
                out[name] = json.loads(value)
            except ValueError:
                pass
    return out


def test_scripted_agent_reaches_only_the_gateway(live: tuple[str, Path]) -> None:
    url, data_dir = live
    gateway_port = int(url.rsplit(":", 1)[1])
    with socket.socket() as other:  # a loopback service on the host the agent must not reach
        other.bind(("127.0.0.1", 0))
        other.listen()
        other_port = other.getsockname()[1]
        started = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "scripted", "--json", "--",
                         "--probe-port", str(gateway_port), "--probe-port", str(other_port),
                         "--probe-path", str(data_dir), "--probe-path", str(Path.cwd()))
        run = started["run"]
        shown = wait_for_exit(run, tries=300)
    log = rsigym("run", "logs", run)
    assert shown["status"] == "exited" and shown["exit_code"] == 0, log
    seen = report(log)
    assert seen["env"] == EXPECTED_ENV
    assert seen["instruction_chars"] > 0
    status, balance = seen["balance"]
    assert status == 200 and balance["budget_usd"] > 0, balance
    assert seen["agent_models_status"] != 0  # the agent route answered through the relay
    reach = seen["reach"]
    assert all(v != "connected" for v in reach.values()), reach  # store, redis, host gateway port, other port
    assert set(reach) == {"5432", "6379", str(gateway_port), str(other_port)}
    assert seen["paths"] == {str(data_dir): False, str(Path.cwd()): False}
    assert [r["run"] for r in rsigym("run", "list", "--json")["data"]] == [run]
    # The key the run got is the one the gateway knows, and stop ends the run there.
    rsigym("run", "stop", run)
    assert rsigym("run", "show", run, "--json")["status"] == "exited"


# -- the wall clock, both meters, the egress allowlist -----------------------------------------------

class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = f"hello from {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _hello_server(host: str) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer((host, 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _quick_task(root: Path, name: str, wall_clock: str, allow: list[str]) -> Path:
    """A copy of the joint-arithmetic task with a short wall clock and an egress allowlist."""
    shutil.copytree(TASKS / "_shared", root / "_shared")
    shutil.copytree(TASKS / "joint-arithmetic", root / name)
    toml = (root / name / "task.toml").read_text()
    toml = re.sub(r'name = "joint-arithmetic"', f'name = "{name}"', toml)
    toml = re.sub(r'wall_clock = "[^"]+"', f'wall_clock = "{wall_clock}"', toml)
    toml = re.sub(r"allow = \[\]", "allow = " + json.dumps(allow), toml)
    (root / name / "task.toml").write_text(toml)
    return root


@pytest.fixture
def live_agent_model(make_gym: Callable[..., Any], standin: Any, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path, Any]]:
    require_bwrap()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    gym = make_gym(config=agent_config(standin[0]))
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        monkeypatch.setenv("RSIGYM_DATA_DIR", str(data_dir))
        yield url, data_dir, gym


def test_the_wall_clock_stops_the_agent_and_its_jobs_spend_shows_on_both_meters_and_egress_is_allowlisted(
        live_agent_model: tuple[str, Path, Any], tmp_path: Path) -> None:
    url, data_dir, gym = live_agent_model
    with _hello_server("127.0.0.2") as allowed, _hello_server("127.0.0.2") as other:
        tasks = _quick_task(tmp_path / "tasks", "joint-quick", "40s", [f"127.0.0.2:{allowed}"])
        started = rsigym("run", "start", "--task", "joint-quick", "--tasks-dir", str(tasks), "--agent", "scripted",
                         "--json", "--", "--fetch", f"http://127.0.0.2:{allowed}/", "--fetch",
                         f"http://127.0.0.2:{other}/", "--work", "--sleep", "600")
        run = started["run"]
        assert started["egress"] == [f"127.0.0.2:{allowed}"]
        sock_dir = Path(os.readlink(data_dir / "runs" / run / "sock"))
        assert sock_dir.is_dir()
        shown = wait_for_exit(run, tries=1200)  # its supervisor stops it at the wall clock (40 s), not its 600 s sleep
    log = rsigym("run", "logs", run)
    assert shown["status"] == "exited" and shown["exit_code"] == 124, log
    assert "the run's wall clock has passed" in log
    seen = report(log)
    assert {"HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"} <= set(seen["env"])
    fetched = seen["fetch"]
    assert fetched[f"http://127.0.0.2:{allowed}/"] == [200, f"hello from {allowed}"]
    status, body = fetched[f"http://127.0.0.2:{other}/"]
    assert status == 403 and json.loads(body)["error"]["type"] == "permission_denied", body
    decisions = [json.loads(line) for line in (data_dir / "runs" / run / "egress.log").read_text().splitlines()]
    assert [(d["port"], d["allowed"]) for d in decisions] == [(allowed, True), (other, False)]
    assert seen["rollout"] == 200 and seen["agent_chat"] == 200
    job_status, job_id = seen["job"]
    assert job_status in (200, 201), seen["job"]
    # The private socket directory went with the supervisor.
    assert not (data_dir / "runs" / run / "sock").exists() and not sock_dir.exists()

    # The gateway's reaper pass ends the run: its training job is cancelled and settled.
    client = client_for(gym)
    assert [j["id"] for j in rsigym("watch", run, "--json")["jobs"]] == [job_id]  # outlived its agent so far
    ended = client.post("/admin/v1/runs/end-expired", headers=admin_headers()).json()["data"]
    assert [e["jobs_cancelled"] for e in ended if e["run_id"] == run] == [1]
    for _ in range(600):
        snap = rsigym("watch", run, "--json")
        if not snap["jobs"]:
            break
        time.sleep(0.1)
    assert snap["jobs"] == []
    with gym.gateway.store.transaction() as s:
        job = s.get(TrainingJob, job_id)
        assert job is not None and job.status == "cancelled" and (job.step or 0) < 5000
    # Spend on both meters, each reported apart, nothing left reserved.
    assert snap["run"]["spent_usd"] > 0 and snap["run"]["reserved_usd"] == 0, snap["run"]
    assert snap["agent_model"]["spent_usd"] > 0 and snap["agent_model"]["reserved_usd"] == 0, snap["agent_model"]
    assert snap["spend_by_service"].get("rollout", 0) > 0 and snap["spend_by_service"].get("training", 0) > 0
    after = client.post("/rollout/v1/chat/completions", headers=bearer(shown_key(data_dir, run)),
                        json={"model": "teacher", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert after.status_code == 403 and after.json()["error"]["type"] == "run_ended"


def _agent_processes(data_dir: Path, run: str) -> list[psutil.Process]:
    """The run's sandbox: everything under its supervisor (nothing once the supervisor is gone)."""
    pid = json.loads((data_dir / "runs" / run / "run.json").read_text())["pid"]
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def _until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_a_paused_run_is_frozen_with_its_clock_and_a_stop_at_the_gateway_ends_the_agent(
        live: tuple[str, Path], tmp_path: Path) -> None:
    """What the dashboard's (or the live monitor's) pause, resume and stop do to a launched run:
    the supervisor freezes the agent's sandbox while the run is paused (its clock stands still),
    thaws it on resume, and kills it when the run is ended at the gateway."""
    url, data_dir = live
    tasks = _quick_task(tmp_path / "tasks", "joint-pause", "120s", [])
    started = rsigym("run", "start", "--task", "joint-pause", "--tasks-dir", str(tasks), "--agent", "scripted",
                     "--json", "--", "--sleep", "600")
    run, key_id = started["run"], started["key_id"]
    assert _until(lambda: "sleeping" in rsigym("run", "logs", run)), rsigym("run", "logs", run)
    assert rsigym("keys", "show", key_id, "--json")["state"] == "running"  # the supervisor reported the start
    admin = httpx.Client(base_url=url, headers=admin_headers(), timeout=30)

    def states() -> set[str]:
        return {p.status() for p in _agent_processes(data_dir, run) if p.is_running()}

    assert admin.post(f"/admin/v1/keys/{key_id}/pause").status_code == 200
    assert _until(lambda: states() == {psutil.STATUS_STOPPED}), states()
    left = admin.get(f"/admin/v1/keys/{key_id}").json()["time_left_s"]
    time.sleep(1.5)
    shown = admin.get(f"/admin/v1/keys/{key_id}").json()
    assert shown["state"] == "paused" and shown["time_left_s"] == left  # the clock stands still
    assert rsigym("run", "show", run, "--json")["state"] == "paused"

    resumed = admin.post(f"/admin/v1/keys/{key_id}/resume").json()
    assert resumed["state"] == "running" and resumed["time_left_s"] == pytest.approx(left, abs=0.5)
    assert _until(lambda: psutil.STATUS_STOPPED not in states()), states()

    ended = admin.post(f"/admin/v1/keys/{key_id}/end", json={"reason": "stopped"})  # the dashboard's stop
    assert ended.status_code == 200, ended.text
    shown = wait_for_exit(run, tries=100)
    log = rsigym("run", "logs", run)
    assert (shown["status"], shown["reason"], shown["state"]) == ("stopped", "stopped", "ended (stopped)"), log
    assert "the run is paused: the agent is frozen" in log and "ended at the gateway (stopped)" in log
    assert _until(lambda: not _agent_processes(data_dir, run))


def shown_key(data_dir: Path, run: str) -> str:
    """The run key, from the operator-side plan (0600): what the agent's environment holds."""
    return str(json.loads((data_dir / "runs" / run / "supervise.json").read_text())["key"])


def test_compose_mode_runs_the_tracks_agent_container_with_its_own_egress_proxy(
        live_agent_model: tuple[str, Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose mode without a Docker engine: a stand-in ``docker`` (tests/fakes/docker_shim.py)
    starts what the run's own compose file declares (ops/launcher_compose.py: its relay to the
    gateway, its egress proxy, its agent from ``agent-joint``'s image) as local processes. The run key
    and the proxy credential travel in the environment, never argv; the proxy refuses a client
    without the run's credential; the wall clock stops the container; the run's containers and
    network are removed at the end."""
    url, data_dir, _ = live_agent_model
    root = Path(__file__).resolve().parents[2]
    bin_dir, state = tmp_path / "bin", tmp_path / "shim"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{root}/tests/fakes/docker_shim.py" "$@"\n')
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SHIM_STATE", str(state))
    monkeypatch.setenv("SHIM_PYTHON", sys.executable)
    monkeypatch.setenv("SHIM_HOSTS", json.dumps({"gateway:8700": url.removeprefix("http://")}))
    with _hello_server("127.0.0.2") as allowed, _hello_server("127.0.0.2") as other:
        tasks = _quick_task(tmp_path / "tasks", "joint-compose", "20s", [f"127.0.0.2:{allowed}"])
        started = rsigym("run", "start", "--task", "joint-compose", "--tasks-dir", str(tasks), "--agent", "scripted",
                         "--mode", "compose", "--compose-file", str(root / "docker-compose.yml"), "--json", "--",
                         "--fetch", f"http://127.0.0.2:{allowed}/", "--fetch", f"http://127.0.0.2:{other}/",
                         "--sleep", "600")
        run = started["run"]
        assert started["mode"] == "compose"
        proxy = state / f"rsigym-egress-{run}.json"
        for _ in range(300):
            if proxy.is_file() and "sleeping" in rsigym("run", "logs", run):
                break
            time.sleep(0.1)
        # The run's proxy, reached without the run's credential (or with a wrong one), serves nothing.
        host, port = json.loads(proxy.read_text())["published"].split(":")
        for auth in ("", "Proxy-Authorization: Basic cnVuOndyb25n\r\n"):  # run:wrong
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(f"GET http://127.0.0.2:{allowed}/ HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
                head = sock.recv(4096).decode(errors="replace")
            assert head.startswith("HTTP/1.1 407"), head
        shown = wait_for_exit(run, tries=900)
    log = rsigym("run", "logs", run)
    assert shown["status"] == "exited" and shown["exit_code"] == 124, log
    seen = report(log)
    assert seen["balance"][0] == 200, log  # the agent's key reached the gateway through the run's own relay
    fetched = seen["fetch"]
    assert fetched[f"http://127.0.0.2:{allowed}/"] == [200, f"hello from {allowed}"]
    assert fetched[f"http://127.0.0.2:{other}/"][0] == 403
    env = set(seen["env"])
    assert {"RSIGYM_URL", "RSIGYM_API_KEY", "RSIGYM_INSTRUCTION", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL",
            "HTTPS_PROXY", "NO_PROXY"} <= env
    assert not {k for k in env if "ADMIN" in k or "SECRET" in k or "TEACHER" in k or k.startswith("PG")}
    calls = [json.loads(line) for line in (state / "calls.log").read_text().splitlines()]
    plan = json.loads((data_dir / "runs" / run / "supervise.json").read_text())
    compose_file = (data_dir / "runs" / run / "compose.yml").read_text()
    for secret in (plan["env"]["RSIGYM_API_KEY"], plan["env"]["RSIGYM_EGRESS_TOKEN"]):
        assert not [c for c in calls if any(secret in part for part in c)]  # never on a command line
        assert secret not in compose_file
    runs = [c for c in calls if c[:1] == ["compose"]]
    relay_run, egress_run, agent_run = runs  # the relay and the proxy first (detached), then the agent
    assert relay_run[-1] == "gym" and egress_run[-1] == "egress" and "-d" in relay_run and "-d" in egress_run
    assert agent_run[agent_run.index("python3") - 1] == "agent"  # the service, then the agent's command
    project = agent_run[agent_run.index("-p") + 1]
    assert project == f"rsigym-run-{run}" and all(c[c.index("-p") + 1] == project for c in runs)
    assert ["stop", "-t", "5", f"rsigym-agent-{run}"] in calls
    assert ["rm", "-f", f"rsigym-agent-{run}", f"rsigym-gym-{run}", f"rsigym-egress-{run}"] in calls
    assert ["network", "rm", f"rsigym-run-{run}"] in calls
    assert not list(state.glob("rsigym-*.json"))  # every container removed


# -- a run ends with its agent, its key closed ---------------------------------------------------------

FAILING_AGENTS = """
[agents.crasher]
command = ["/bin/sh", "-c", "echo crashing >&2; exit 3"]

[agents.missing]
command = ["/nonexistent/agent-cli", "{instruction}"]
"""


@pytest.mark.parametrize(("agent", "exit_code", "reason"), [("crasher", 3, "crashed"),
                                                              ("missing", 127, "failed_to_start")])
def test_a_run_whose_agent_crashes_or_never_starts_ends_with_its_key_closed(
        live: tuple[str, Path], tmp_path: Path, agent: str, exit_code: int, reason: str) -> None:
    url, data_dir = live
    agents = tmp_path / "agents.toml"
    agents.write_text(FAILING_AGENTS)
    started = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", agent, "--agents", str(agents), "--json")
    run, state = started["run"], f"ended ({reason})"
    shown = wait_for_exit(run, tries=300)
    assert (shown["exit_code"], shown["reason"], shown["state"]) == (exit_code, reason, state), rsigym("run", "logs", run)
    assert [r["state"] for r in rsigym("run", "list", "--json")["data"]] == [state]
    # The run key says the same, with what the run was, and its budget as unspent, not as still to spend.
    key = rsigym("keys", "show", started["key_id"], "--json")
    assert (key["state"], key["agent_exit"], key["task"], key["agent"]) == (state, exit_code, "joint-arithmetic", agent)
    assert key["agent_version"] and key["status"] == "active"
    assert key["unspent_usd"] == key["budget_usd"] > 0
    details = rsigym("keys", "show", started["key_id"])
    assert state in details and "unspent_usd" in details and "remaining_usd" not in details
    # Closed: the gateway refuses the run key from now on.
    refused = httpx.get(f"{url}/rollout/v1/models", headers=bearer(shown_key(data_dir, run)))
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "run_ended", refused.text
    # Stopping it afterwards changes nothing of why it ended.
    rsigym("run", "stop", run)
    assert rsigym("keys", "show", started["key_id"], "--json")["state"] == state
    assert rsigym("run", "show", run, "--json")["state"] == state
