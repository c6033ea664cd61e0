"""A task's Dockerfile with RUN steps, built into a sandbox template and used by its trials.

The task installs a Python package from a wheel file in its ``environment/`` (no network at
build time) and its verifier imports it: the oracle (in the harness's sandbox) and the verifier
(in a fresh sandbox of its own) both see what the build installed. Builds are content-addressed
(one build per Dockerfile and context), refused with the failing step's reason, closed to run
keys, and as contained as a sandbox: a build that tries to reach the host gets nothing.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import http.server
import shutil
import socketserver
import textwrap
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from access.keys import KeyRegistry
from access.policy import Policy
from services.evaluation.benchmarks import TaskRef, load_benchmark
from services.evaluation.templates import build_templates, load, save
from services.evaluation.trials import TrialRequest, run_trial
from tests.conftest import create_key, gym_config
from tests.fakes.live_gym import harness_archive, live_gym
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

ROOT = Path(__file__).resolve().parents[4]
WHEEL = "gymdemo-0.1-py3-none-any.whl"
DOCKERFILE = f"""\
FROM python:3.11-slim
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY {WHEEL} /tmp/
COPY app/ /app/
RUN python3 -m pip install --no-index /tmp/{WHEEL}
RUN echo built > /app/built.txt
"""
TEST_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
reward=0
if python3 -c 'import gymdemo, sys; sys.exit(0 if open("/app/answer.txt").read().strip() == str(gymdemo.ANSWER) else 1)' \\
   && [ "$(cat /app/greeting.txt)" = hello ]; then reward=1; fi
echo "$reward" > /logs/verifier/reward.txt
"""
SOLVE_SH = """\
#!/bin/bash
python3 -c 'import gymdemo; print(gymdemo.ANSWER)' > /app/answer.txt
"""


def write_wheel(path: Path, answer: int = 42) -> None:
    """A pure-Python wheel ``gymdemo`` whose ``ANSWER`` is ``answer``."""
    files = {"gymdemo/__init__.py": f"ANSWER = {answer}\n",
             "gymdemo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: gymdemo\nVersion: 0.1\n",
             "gymdemo-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                            "Tag: py3-none-any\n"}
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(text)}")
        wheel.writestr("gymdemo-0.1.dist-info/RECORD", "\n".join([*record, "gymdemo-0.1.dist-info/RECORD,,"]) + "\n")


def write_benchmark(root: Path, dockerfile: str = DOCKERFILE, answer: int = 42) -> Path:
    root.mkdir(parents=True)
    (root / "benchmark.toml").write_text('name = "wheelbench"\ndescription = "a wheel installed at build"\nversion = "1"\n[splits.dev]\nhidden = false\n'
                                         '[splits.official]\nhidden = true\n')
    for split, task_id in (("dev", "wheel-dev"), ("official", "wheel-off")):
        task = root / split / task_id
        for sub in ("environment/app", "tests", "solution"):
            (task / sub).mkdir(parents=True)
        (task / "task.toml").write_text(textwrap.dedent(f"""\
            schema_version = "1.4"
            artifacts = ["/app/answer.txt"]
            [task]
            name = "rsigym/wheelbench__{task_id}"
            [metadata]
            kind = "shell"
            [verifier]
            timeout_sec = 60.0
            environment_mode = "separate"
            [agent]
            timeout_sec = 120.0
            [environment]
            workdir = "/app"
            """))
        (task / "instruction.md").write_text("Write the `ANSWER` of the installed `gymdemo` package to /app/answer.txt.\n")
        (task / "environment" / "Dockerfile").write_text(dockerfile)
        (task / "environment" / "app" / "greeting.txt").write_text("hello\n")
        write_wheel(task / "environment" / WHEEL, answer)
        (task / "tests" / "test.sh").write_text(TEST_SH)
        (task / "solution" / "solve.sh").write_text(SOLVE_SH)
    return root


@dataclass
class Served:
    url: str
    build_key: str
    sandbox_key: str
    door_key: str
    run_key: str
    trials: Path

    def build(self, tasks: list[TaskRef], key: str | None = None) -> Any:
        return build_templates(tasks, self.url, key or self.build_key)

    def trial(self, task: TaskRef, template: str, agent: str = "oracle") -> Any:
        req = TrialRequest(task=task, harness_dir=None, gateway_url=self.url, sandbox_key=self.sandbox_key,
                           door_key=self.door_key, model="tiny", sampling={}, attempt=1, trials_dir=self.trials,
                           template=template, agent=agent)  # type: ignore[arg-type]
        return asyncio.run(run_trial(req))


@pytest.fixture
def served(gym: Any, tmp_path: Path) -> Iterator[Served]:
    with serve_gym(gym) as url:
        with httpx.Client(base_url=url) as c:
            run = create_key(c, budget_usd=5.0)
        registry = KeyRegistry(gym.gateway.store)

        def mint(policy: dict[str, Any]) -> str:
            return registry.create(policy=Policy.model_validate(policy), budget_nusd=None, parent_id=run["id"],
                                   platform=True)[1]

        yield Served(url, mint({"services": {"sandbox": {"build": True, "internet": False}}}),
                     mint({"services": {"sandbox": {"door": True, "internet": False, "max_concurrency": 4}}}),
                     mint({"services": {"inference": {"models": ["tiny"], "max_concurrency": 4}}}),
                     run["key"], tmp_path / "trials")


def tasks_of(root: Path) -> list[TaskRef]:
    return [t for _, t in load_benchmark(root).tasks()]


def test_a_wheel_installed_at_build_is_there_for_the_harness_and_the_verifier(served: Served, tmp_path: Path) -> None:
    tasks = tasks_of(write_benchmark(tmp_path / "bench"))
    built = served.build(tasks)
    assert built.failed == {}
    assert set(built.built) == {"wheel-dev", "wheel-off"}
    template = built.built["wheel-dev"]
    assert template.startswith("build-") and built.built["wheel-off"] == template  # one content, one template

    oracle = served.trial(tasks[0], template)
    assert (oracle.error, oracle.reward) == (None, 1.0), oracle  # imported in both sandboxes
    nop = served.trial(tasks[0], template, agent="nop")
    assert (nop.error, nop.reward) == (None, 0.0), nop

    # Without its template the task is refused before any sandbox starts, with the reason.
    unbuilt = served.trial(tasks[0], "base")
    assert unbuilt.reward is None and "no template was built" in (unbuilt.error or ""), unbuilt

    # The map is kept with the registered copy; a second build of the same content is a lookup.
    save(tmp_path / "bench", built)
    assert load(tmp_path / "bench").template_of("wheel-dev") == template
    again = httpx.post(f"{served.url}/sandbox/v2/templates", headers={"X-API-Key": served.build_key}, timeout=120,
                       json={"dockerfile": DOCKERFILE, "context": _context(tasks[0])})
    assert again.status_code == 200 and again.json()["templateID"] == template and again.json()["reused"] is True


def test_another_context_is_another_template(served: Served, tmp_path: Path) -> None:
    first = served.build(tasks_of(write_benchmark(tmp_path / "a", answer=42)))
    second = served.build(tasks_of(write_benchmark(tmp_path / "b", answer=43)))
    assert first.built["wheel-dev"] != second.built["wheel-dev"]


def test_what_cannot_be_built_is_refused_with_the_step_and_the_reason(served: Served, tmp_path: Path) -> None:
    apt = write_benchmark(tmp_path / "apt", DOCKERFILE + "RUN apt-get install -y cowsay\n")
    failed = served.build(tasks_of(apt)).failed
    assert "RUN apt-get install -y cowsay failed" in failed["wheel-dev"], failed

    net = write_benchmark(tmp_path / "net", DOCKERFILE + "RUN python3 -m pip install requests==2.32.3\n")
    failed = served.build(tasks_of(net)).failed
    assert "no network" in failed["wheel-dev"], failed

    stage = write_benchmark(tmp_path / "stage", DOCKERFILE + "COPY --from=builder /x /x\n")
    assert "multi-stage builds are not supported" in served.build(tasks_of(stage)).failed["wheel-dev"]


def test_a_run_key_may_not_build(served: Served, tmp_path: Path) -> None:
    tasks = tasks_of(write_benchmark(tmp_path / "bench"))
    refused = httpx.post(f"{served.url}/sandbox/v2/templates", headers={"X-API-Key": served.run_key}, timeout=60,
                         json={"dockerfile": DOCKERFILE, "context": _context(tasks[0])})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["type"] == "permission_denied"


def test_a_build_that_attacks_the_host_gets_nothing(served: Served, gym: Any, tmp_path: Path) -> None:
    data_dir = Path(gym.gateway.context.settings.data_dir).resolve()
    attack = DOCKERFILE + textwrap.dedent(f"""\
        RUN (echo pwned >> /etc/hosts) 2>/dev/null; (touch /usr/bin/pwned) 2>/dev/null; \\
            (ls {data_dir} > /app/data_dir.txt) 2>/dev/null; (cat /proc/1/environ > /app/env.txt) 2>/dev/null; \\
            (python3 -c 'import socket; socket.create_connection(("127.0.0.1", {served.url.rsplit(":", 1)[1]}), 2)' \\
             && echo reached > /app/net.txt) 2>/dev/null; echo ran > /app/ran.txt
        """)
    hosts_before = Path("/etc/hosts").read_bytes()
    built = served.build(tasks_of(write_benchmark(tmp_path / "bench", attack)))
    assert built.failed == {}, built.failed
    assert Path("/etc/hosts").read_bytes() == hosts_before and not Path("/usr/bin/pwned").exists()
    layer = Path(gym.gateway.context.settings.data_dir) / "sandbox-templates" / built.built["wheel-dev"] / "layer" / "files" / "app"
    assert not (layer / "data_dir.txt").exists() or (layer / "data_dir.txt").read_text() == ""
    assert (layer / "ran.txt").is_file()  # the attack ran, and got:
    assert not (layer / "net.txt").exists()  # no network: not even the gym on loopback
    assert "RSIGYM" not in ((layer / "env.txt").read_text() if (layer / "env.txt").exists() else "")


def _context(task: TaskRef) -> str:
    from services.evaluation.templates import _context_tar

    return _context_tar(task.path / "environment")


class _Index(http.server.SimpleHTTPRequestHandler):
    """A PEP 503 simple index of one wheel, as a package registry the operator allows."""

    def log_message(self, *args: Any) -> None:
        pass


def test_a_build_reaches_only_the_registries_the_operator_allows(make_gym: Any, standin: Any, tmp_path: Path) -> None:
    index = tmp_path / "index"
    (index / "simple" / "gymdemo").mkdir(parents=True)
    write_wheel(index / "simple" / "gymdemo" / WHEEL, answer=7)
    (index / "simple" / "gymdemo" / "index.html").write_text(f'<a href="{WHEEL}">{WHEEL}</a>\n')
    handler = functools.partial(_Index, directory=str(index))
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as registry:
        threading.Thread(target=registry.serve_forever, daemon=True).start()
        port = registry.server_address[1]
        config = gym_config(standin[0])
        config.sandbox.build_egress = [f"127.0.0.1:{port}"]  # an address entry: the operator's own choice
        gym = make_gym(config=config)
        with serve_gym(gym) as url:
            with httpx.Client(base_url=url) as c:
                run = create_key(c, budget_usd=5.0)
            _, key = KeyRegistry(gym.gateway.store).create(
                policy=Policy.model_validate({"services": {"sandbox": {"build": True, "internet": False}}}),
                budget_nusd=None, parent_id=run["id"], platform=True)
            pip = (f"RUN python3 -m pip install --index-url http://127.0.0.1:{port}/simple gymdemo"
                   " && python3 -c 'import gymdemo; assert gymdemo.ANSWER == 7'\n")
            allowed = build_templates(tasks_of(write_benchmark(tmp_path / "ok", DOCKERFILE.split("RUN")[0] + pip)),
                                      url, key)
            assert allowed.failed == {}, allowed.failed
            elsewhere = ("RUN python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:"
                         f"{url.rsplit(':', 1)[1]}/healthz\", timeout=5)'\n")
            refused = build_templates(tasks_of(write_benchmark(tmp_path / "no", DOCKERFILE + elsewhere)), url, key)
            assert "403" in refused.failed["wheel-dev"] or "Forbidden" in refused.failed["wheel-dev"], refused.failed
        registry.shutdown()


HARNESS = """python3 -c 'import gymdemo; print(gymdemo.ANSWER)' > /app/answer.txt
"""


def test_registration_builds_validates_and_an_agent_evaluates_in_the_template(tmp_path: Path) -> None:
    """As an operator and an agent see it: the benchmark registers ready (its template built at
    validation), an agent's harness imports the package in its sandbox and scores 1, and a
    Dockerfile that cannot be built here refuses its benchmark with the step and the reason."""
    with live_gym(tmp_path / "gym") as live:
        row = live.register(write_benchmark(tmp_path / "bench"))
        assert row["status"] == "ready", row
        assert "build_failures" not in row["validation"]
        run = live.key(budget=2.0)
        with live.agent(run) as agent:
            harness = agent.post("/evaluation/v1/harnesses", content=harness_archive("wheel", HARNESS))
            assert harness.status_code == 201, harness.text
            job = agent.post("/evaluation/v1/jobs", json={"benchmark": "wheelbench", "split": "dev", "model": "tiny",
                                                          "harness": harness.json()["id"]})
            assert job.status_code in (200, 201, 202), job.text
            done = live.wait_job(agent, job.json()["id"])
            assert (done["status"], done["score"]) == ("succeeded", 1.0), done

        broken = write_benchmark(tmp_path / "broken", DOCKERFILE + "RUN apt-get install -y cowsay\n")
        (broken / "benchmark.toml").write_text((broken / "benchmark.toml").read_text().replace("wheelbench", "aptbench"))
        refused = live.register(broken)
        assert refused["status"] == "refused", refused
        failures = refused["validation"]["build_failures"]
        assert set(failures) == {"wheel-dev", "wheel-off"}
        assert "RUN apt-get install -y cowsay failed" in failures["wheel-dev"]
