"""Harbor trials on the gym's own sandbox service, against a real embedded gym on a port.

The keys are minted the way the evaluation service mints them: platform child keys of the
run key, one for the sandbox (with a model door, no internet) and one for the door itself
(inference of the tiny model only). Harbor's ``Trial`` then runs with the gym's environment
and either Harbor's oracle / nop agents or the gym's harness agent.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from harbor.models.task.config import TaskConfig
from harbor.models.trajectories import Trajectory

from access.keys import KeyRegistry
from access.policy import Policy
from services.evaluation.benchmarks import TaskRef, load_benchmark
from services.evaluation.trials import TrialOutcome, TrialRequest, run_trial
from tests.conftest import create_key
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

ROOT = Path(__file__).resolve().parents[4]
MINIMAL_HARNESS = ROOT / "agent_container" / "harness" / "minimal"
SANDBOX_POLICY = {"services": {"sandbox": {"door": True, "internet": False, "max_concurrency": 4}}}
DOOR_POLICY = {"services": {"inference": {"models": ["tiny"], "max_concurrency": 4}}}
"""The run key's (joint) preset caps inference concurrency; a child that leaves the cap out gets it too."""


@dataclass
class Served:
    url: str
    gym: Any
    sandbox_key: str
    door_key: str
    run_key: str
    trials_dir: Path

    def request(self, task: TaskRef, **kw: Any) -> TrialRequest:
        fields: dict[str, Any] = dict(
            harness_dir=MINIMAL_HARNESS, gateway_url=self.url, sandbox_key=self.sandbox_key, door_key=self.door_key,
            model="tiny", sampling={"temperature": 0, "max_tokens": 16}, attempt=1, trials_dir=self.trials_dir)
        fields.update(kw)
        return TrialRequest(task=task, **fields)

    def running_sandboxes(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/sandbox/v2/sandboxes", headers={"X-API-Key": self.sandbox_key})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def served(gym: Any, tmp_path: Path) -> Iterator[Served]:
    with serve_gym(gym) as url:
        with httpx.Client(base_url=url) as c:
            run = create_key(c, budget_usd=5.0)
        registry = KeyRegistry(gym.gateway.store)
        _, sandbox_key = registry.create(policy=Policy.model_validate(SANDBOX_POLICY), budget_nusd=None,
                                         parent_id=run["id"], platform=True)
        _, door_key = registry.create(policy=Policy.model_validate(DOOR_POLICY), budget_nusd=None,
                                      parent_id=run["id"], platform=True)
        yield Served(url, gym, sandbox_key, door_key, run["key"], tmp_path / "trials")


@pytest.fixture(scope="module")
def tasks() -> dict[str, TaskRef]:
    found: dict[str, TaskRef] = {}
    for name in ("arithmetic", "shell"):
        found.update({t.id: t for _, t in load_benchmark(ROOT / "benchmarks" / name).tasks()})
    return found


def run(*requests: TrialRequest) -> list[TrialOutcome]:
    async def all_of() -> list[TrialOutcome]:
        return list(await asyncio.gather(*(run_trial(r) for r in requests)))

    return asyncio.run(all_of())


def test_oracle_scores_one_and_nop_scores_zero(served: Served, tasks: dict[str, TaskRef]) -> None:
    ids = ["sub-0001", "sub-0002", "sh-0001", "sh-0002"]  # sh-* copy environment/app/ into /app
    oracle = run(*(served.request(tasks[i], agent="oracle", attempt=n) for n, i in enumerate(ids)))
    for outcome in oracle:
        assert outcome.error is None, outcome
        assert outcome.reward == 1.0, outcome
        assert outcome.sandbox_id and outcome.result_path and Path(outcome.result_path).is_file()
        result = json.loads(Path(outcome.result_path).read_text())
        assert result["verifier_result"]["rewards"] == {"reward": 1.0}
    assert len({o.sandbox_id for o in oracle}) == len(ids)  # one sandbox per trial, run side by side

    nop = run(served.request(tasks["sub-0001"], agent="nop"), served.request(tasks["sh-0001"], agent="nop"))
    for outcome in nop:
        assert (outcome.error, outcome.reward) == (None, 0.0), outcome
    assert served.running_sandboxes() == []  # every trial's sandbox was killed


def test_minimal_harness_answers_through_the_door(served: Served, tasks: dict[str, TaskRef]) -> None:
    (outcome,) = run(served.request(tasks["sub-0001"]))
    assert outcome.error is None, outcome
    assert outcome.reward in (0.0, 1.0)
    assert outcome.trajectory is not None
    trajectory = Trajectory.model_validate(outcome.trajectory)
    assert trajectory.agent.name == "minimal" and trajectory.agent.model_name == "tiny"
    assert trajectory.steps[0].source == "user" and trajectory.steps[0].message == "What is 83 - 76?"
    assert any(s.source == "agent" for s in trajectory.steps)  # the model answered, through the door
    assert trajectory.final_metrics and (trajectory.final_metrics.total_completion_tokens or 0) > 0
    assert '"status": "ok"' in outcome.agent_output

    result = json.loads(Path(outcome.result_path or "").read_text())
    assert result["agent_info"]["name"] == "rsigym-harness"
    assert result["agent_result"]["n_output_tokens"] > 0
    assert result["agent_result"]["metadata"]["trajectory"] == "valid"
    # the door's calls were metered on the trial's keys, within the run's budget
    balance = httpx.get(f"{served.url}/v1/balance", headers={"Authorization": f"Bearer {served.run_key}"}).json()
    assert balance["spent_usd"] > 0
    # and no key of any kind reached the trial directory Harbor wrote
    for path in Path(outcome.result_path or "").parent.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert served.sandbox_key not in text and served.door_key not in text, path
    assert served.running_sandboxes() == []


PROBE = textwrap.dedent("""\
    import glob, json, os, urllib.error, urllib.request

    def call(url, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                     "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()[:400]
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()[:400]
        except OSError as e:
            return None, type(e).__name__

    base = os.environ["OPENAI_BASE_URL"]
    root = base[: -len("/inference/v1")]
    found = []
    for path in glob.glob("/run/**", recursive=True) + glob.glob("/proc/[0-9]*/environ"):
        try:
            if "rsk-" in open(path, errors="replace").read():
                found.append(path)
        except OSError:
            pass
    report = {
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "rollout": call(root + "/rollout/v1/chat/completions", {"model": "teacher", "messages": []}),
        "sandbox": call(root + "/sandbox/v2/sandboxes"),
        "models": call(base + "/models"),
        "gateway": call("GATEWAY/healthz"),
        "rsk_files": found,
        "instruction": open(os.environ["RSIGYM_TASK_INSTRUCTION_FILE"]).read(),
    }
    os.makedirs("/logs/agent", exist_ok=True)
    json.dump(report, open("/logs/agent/probe.json", "w"))
    json.dump({"schema_version": "ATIF-v1.6", "session_id": "probe", "agent": {"name": "probe", "version": "0"},
               "steps": [{"step_id": 1, "source": "user", "message": report["instruction"]}]},
              open(os.environ["RSIGYM_TRAJECTORY_FILE"], "w"))
    """)


def test_door_leads_to_inference_only_and_no_key_enters_the_sandbox(
        served: Served, tasks: dict[str, TaskRef], tmp_path: Path) -> None:
    harness = tmp_path / "probe-harness"
    harness.mkdir()
    (harness / "harness.toml").write_text('[harness]\nname = "probe"\ninstall = "touch /harness/installed"\n'
                                          'run = "/usr/bin/python3 /harness/probe.py"\n')
    (harness / "probe.py").write_text(PROBE.replace("GATEWAY", served.url))
    (outcome,) = run(served.request(tasks["sh-0001"], harness_dir=harness))
    assert outcome.error is None, outcome
    assert outcome.reward == 0.0  # the probe answers nothing
    report = json.loads((Path(outcome.result_path or "").parent / "agent" / "probe.json").read_text())

    assert report["rollout"][0] == 403 and "inference" in report["rollout"][1]
    assert report["sandbox"][0] == 403
    assert report["models"][0] == 200 and '"tiny"' in report["models"][1]  # the door key was put on
    assert report["gateway"][0] is None  # no network: the gateway itself is out of reach
    env = report["env"]
    assert env["OPENAI_API_KEY"] == "door"
    assert env["OPENAI_BASE_URL"].startswith("http://127.0.0.1:") and env["OPENAI_BASE_URL"].endswith("/inference/v1")
    assert env["RSIGYM_MODEL"] == "tiny" and json.loads(env["RSIGYM_SAMPLING"]) == {"temperature": 0, "max_tokens": 16}
    assert json.loads(env["RSIGYM_TASK_METADATA"]) == {"kind": "shell", "template": "count_level"}
    assert env["RSIGYM_TRAJECTORY_FILE"] == "/logs/agent/trajectory.json"
    assert not [k for k, v in env.items() if "rsk-" in v]
    assert report["rsk_files"] == []
    assert report["cwd"] == "/app"
    assert report["instruction"].startswith("Each line of /app/app.log")
    assert outcome.trajectory is not None and outcome.trajectory["session_id"] == "probe"
    assert served.running_sandboxes() == []


def test_failures_are_recorded_not_raised(served: Served, tasks: dict[str, TaskRef], tmp_path: Path) -> None:
    # a Dockerfile that needs an image build is refused before any sandbox exists
    task_dir = tmp_path / "needs-build"
    shutil.copytree(tasks["sub-0001"].path, task_dir)
    with (task_dir / "environment" / "Dockerfile").open("a") as fh:
        fh.write("RUN pip install numpy\n")
    config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    needs_build = TaskRef("needs-build", task_dir, "qa", "/app/answer.txt", config)

    broken = tmp_path / "broken-harness"
    broken.mkdir()
    (broken / "harness.toml").write_text('[harness]\nname = "broken"\ninstall = "exit 3"\nrun = "true"\n')

    slow = tmp_path / "slow-harness"
    slow.mkdir()
    (slow / "harness.toml").write_text('[harness]\nname = "slow"\nrun = "sleep 30 && echo 18 > /app/answer.txt"\n')
    # a verifier that also lists the sandbox's processes: the timed-out harness must be gone
    watched_dir = tmp_path / "watched"
    shutil.copytree(tasks["sub-0002"].path, watched_dir)
    (watched_dir / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done > /logs/verifier/processes.txt\n"
        "echo 0 > /logs/verifier/reward.txt\n")
    watched = TaskRef("watched", watched_dir, "qa", "/app/answer.txt", tasks["sub-0002"].config)

    refused, install_failed, timed_out, no_harness = run(
        served.request(needs_build, agent="oracle"),
        served.request(tasks["sub-0001"], harness_dir=broken),
        served.request(watched, harness_dir=slow, agent_timeout_s=1),
        served.request(tasks["sub-0003"], harness_dir=None),
    )
    assert refused.reward is None and "has RUN steps and no template was built" in (refused.error or "")
    assert refused.sandbox_id is None
    assert install_failed.reward is None and "install exited with code 3" in (install_failed.error or "")
    assert "AgentTimeoutError" in (timed_out.error or "") and timed_out.reward == 0.0  # still verified
    processes = (Path(timed_out.result_path or "").parent / "verifier" / "processes.txt").read_text()
    assert "sleep 30" not in processes and "test.sh" in processes, processes
    assert no_harness.error and "harness_dir" in no_harness.error
    assert served.running_sandboxes() == []
    # whose failure each was (services/evaluation/failures.py): only the harness's are its zeros
    assert [o.failure_kind for o in (refused, install_failed, timed_out, no_harness)] == [
        "platform", "agent", "agent", "platform"]

    # a key that can no longer create sandboxes: an error, not an exception
    (bad,) = run(served.request(tasks["sub-0001"], agent="oracle", sandbox_key="rsk-not-a-key"))
    assert bad.reward is None and "401" in (bad.error or "") and bad.failure_kind == "platform"


def test_a_trial_cut_short_during_its_sandbox_create_leaves_no_sandbox(
        served: Served, tasks: dict[str, TaskRef], monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial only lists its sandboxes by metadata when a create went unanswered; this is
    that case: the sandbox exists, its id never reached the trial, the trial is cancelled."""
    service = served.gym.service_apps["sandbox"].state.sandbox
    created = threading.Event()
    original = service.create

    def slow_create(*args: Any, **kwargs: Any) -> dict[str, Any]:
        view = original(*args, **kwargs)
        created.set()
        time.sleep(1.5)  # the answer is late: the trial gives up before it arrives
        return view

    monkeypatch.setattr(service, "create", slow_create)

    async def cut_short() -> None:
        task = asyncio.create_task(run_trial(served.request(tasks["sub-0001"], agent="oracle")))
        await asyncio.to_thread(created.wait, 30)  # the sandbox exists; its answer is not back yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cut_short())
    assert served.running_sandboxes() == []  # found by the trial's metadata and killed


def test_set_up_deferred_to_the_first_command_holds_or_fails_the_trial(
    served: Served, tasks: dict[str, TaskRef], tmp_path: Path
) -> None:
    """The environment's set-up (Harbor's log directories and the working directory, made by the
    sandbox's create; the modes of copied files, at the head of the first command) starts no
    process of its own. The oracle still finds its working directory made and a copied file
    executable, a command that exits 97 by itself (printing the set-up's marker, even) is not
    taken for a failed set-up, a set-up that fails (a working directory the create does not take,
    under a copied file) fails the trial with the reason, and so does a working directory the
    create cannot make (under a file of the template); neither is ever scored."""
    deferred = tmp_path / "deferred"
    shutil.copytree(tasks["sh-0001"].path, deferred)
    env_dir = deferred / "environment"
    (env_dir / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /srv/deep/work\nCOPY app/ /app/\n"
                                        "COPY count.sh /opt/bin/count.sh\n"
                                        "COPY count.sh /srv/deep/work\n")  # into the directory WORKDIR made
    (env_dir / "count.sh").write_text("#!/bin/bash\nawk '$2 == \"ERROR\"' /app/app.log | wc -l\n")
    (env_dir / "count.sh").chmod(0o755)
    (deferred / "solution" / "solve.sh").write_text(
        "#!/bin/bash\n[ \"$(pwd)\" = /srv/deep/work ] && [ -d /logs/agent ] && [ -x ./count.sh ] && "
        "/opt/bin/count.sh > /app/answer.txt\n"
        "exit 97\n")  # its own status, which is no set-up failure
    text = (deferred / "task.toml").read_text().replace('workdir = "/app"', 'workdir = "/srv/deep/work"')
    (deferred / "task.toml").write_text(text)
    config = TaskConfig.model_validate_toml(text)
    held = TaskRef("deferred", deferred, "qa", "/app/answer.txt", config)

    broken = tmp_path / "broken-setup"
    shutil.copytree(deferred, broken)
    # A trailing "/" is no normal path: the create leaves it to the set-up, which runs after the COPY.
    (broken / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app/app.log/under/\n"
                                                      "COPY app/ /app/\n")
    text = (broken / "task.toml").read_text().replace('workdir = "/srv/deep/work"', 'workdir = "/app/app.log/under/"')
    (broken / "task.toml").write_text(text)
    failed_setup = TaskRef("broken-setup", broken, "qa", "/app/answer.txt", TaskConfig.model_validate_toml(text))

    unmade = tmp_path / "unmade-workdir"
    shutil.copytree(deferred, unmade)
    (unmade / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /usr/bin/env/under\n")
    text = (unmade / "task.toml").read_text().replace('workdir = "/srv/deep/work"', 'workdir = "/usr/bin/env/under"')
    (unmade / "task.toml").write_text(text)
    refused_create = TaskRef("unmade-workdir", unmade, "qa", "/app/answer.txt", TaskConfig.model_validate_toml(text))

    own_97 = tmp_path / "exits-97"
    own_97.mkdir()
    # its install even prints the marker a failed set-up prints: it still cannot pass for one
    (own_97 / "harness.toml").write_text('[harness]\nname = "exits-97"\n'
                                         'install = "echo rsigym-sandbox-setup-failed >&2; exit 97"\nrun = "true"\n')

    ok, nothing_ran, failed, exited, refused = run(
        served.request(held, agent="oracle"),
        served.request(held, agent="nop"),  # no command before the agent's logs are read: set-up runs alone
        served.request(failed_setup, agent="oracle"),
        served.request(held, harness_dir=own_97),  # the install is the first command: set-up at its head
        served.request(refused_create, agent="oracle"),
    )
    assert (ok.error, ok.reward) == (None, 1.0), ok
    assert (nothing_ran.error, nothing_ran.reward) == (None, 0.0), nothing_ran
    assert failed.reward is None and "could not prepare the sandbox" in (failed.error or ""), failed
    assert exited.reward is None and "install exited with code 97" in (exited.error or ""), exited
    assert refused.reward is None and "/usr/bin/env/under" in (refused.error or "") \
        and "could not make the sandbox's directories" in (refused.error or ""), refused
    assert served.running_sandboxes() == []


def test_empty_directories_reach_the_verifier_and_the_reads(served: Served, tasks: dict[str, TaskRef],
                                                            tmp_path: Path) -> None:
    """An upload's empty directories are made with the next command, or just before the next read
    (services/evaluation/harbor/environment.py): the agent leaves an empty directory and an empty file in
    /app, Harbor carries /app to the verifier's sandbox (the directory's make waits for the
    verifier's next command), and the verifier scores 1 only if both arrived."""
    task = tmp_path / "empties"
    shutil.copytree(tasks["sh-0001"].path, task)
    solve = task / "solution" / "solve.sh"
    solve.write_text(solve.read_text() + "mkdir -p /app/kept/empty && : > /app/kept/marker\n")
    test = task / "tests" / "test.sh"
    test.write_text(test.read_text().replace(
        "if got=", "[ -d /app/kept/empty ] && [ -f /app/kept/marker ] && if got="))
    ref = TaskRef("empties", task, "shell", None, TaskConfig.model_validate_toml((task / "task.toml").read_text()))
    control = tmp_path / "control"
    shutil.copytree(task, control)
    (control / "solution" / "solve.sh").write_text(solve.read_text().replace("mkdir -p /app/kept/empty && ", ""))
    control_ref = TaskRef("control", control, "shell", None, ref.config)

    kept, lost = run(served.request(ref, agent="oracle"), served.request(control_ref, agent="oracle"))
    assert (kept.error, kept.reward) == (None, 1.0), kept
    assert (lost.error, lost.reward) == (None, 0.0), lost  # the check can fail: no directory, no reward
    assert served.running_sandboxes() == []


def test_the_verifier_sees_the_agents_app_and_no_stale_reward(served: Served, tasks: dict[str, TaskRef],
                                                              tmp_path: Path) -> None:
    """The image puts a stale reward of 1 in /logs/verifier and a file in /app — in the agent's
    sandbox and again in the verifier's fresh one (its Dockerfile is replayed there too). Harbor
    resets both directories before the verifier runs, and the environment skips a reset or the
    removal of stale rewards only where it knows there is nothing to remove
    (services/evaluation/harbor/environment.py). The oracle deletes the image's file; test.sh writes a
    reward only for a right answer with that file gone, and writes nothing otherwise. So the oracle
    scores 1 only if the verifier's /app is the agent's, and nop (no answer) gets no reward at all
    rather than the stale 1."""
    task = tmp_path / "resets"
    shutil.copytree(tasks["sh-0001"].path, task)
    env_dir = task / "environment"
    (env_dir / "app" / "stale.txt").write_text("from the image\n")
    (env_dir / "seed").mkdir()
    (env_dir / "seed" / "reward.txt").write_text("1\n")
    (env_dir / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\nCOPY app/ /app/\n"
                                        "COPY seed/ /logs/verifier/\n")
    solve = task / "solution" / "solve.sh"
    solve.write_text(solve.read_text() + "rm -f /app/stale.txt\n")
    test = task / "tests" / "test.sh"
    test.write_text(test.read_text().replace(
        'echo "$reward" > /logs/verifier/reward.txt',
        '[ "$reward" = 1 ] && [ ! -e /app/stale.txt ] && echo 1 > /logs/verifier/reward.txt'))
    ref = TaskRef("resets", task, "shell", None, TaskConfig.model_validate_toml((task / "task.toml").read_text()))

    solved, nothing = run(served.request(ref, agent="oracle"), served.request(ref, agent="nop"))
    assert (solved.error, solved.reward) == (None, 1.0), solved
    assert nothing.reward is None and "reward" in (nothing.error or "").lower(), nothing
    assert served.running_sandboxes() == []
