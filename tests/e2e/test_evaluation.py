"""Evaluation end to end, as operator and agent do it: bundled benchmarks registered and
validated (every oracle 1, every empty answer 0), base vs trained checkpoint on the
arithmetic dev split through the SDK, result detail by policy, hidden splits, a probing
harness that finds no way out of its trial, and scoring on the operator's budget.

Both bundled benchmarks are registered cut to their first 20 tasks of each split (the official
split drawn by the gym at registration, as for the whole benchmark). Arithmetic's tasks are one kind
(two-digit subtraction, every task the same files but the numbers), so 20 a split validate it 20
times over; the whole benchmark's 160 trials more, and 80 more to evaluate base and checkpoint on
60 dev tasks, took ~1.5 minutes of the suite. Its 120 tasks' structure is checked without sandboxes
(tests/unit/services/evaluation/test_benchmarks.py). Shell's tasks are ten generated kinds in rotation
(services/evaluation/task_generators/shell.py), so the cut validates every kind twice in each split.
Arithmetic is scored too (avg@3 on its 20 official tasks). `make demo` registers and validates both
bundled benchmarks whole."""

from __future__ import annotations

import io
import json
import random
import shutil
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import rsigym
from ops.demo_common import trimmed_benchmarks
from services.evaluation.task_generators import shell as shell_generator
from services.models.synthetic import subtraction
from tests.fakes.live_gym import LiveGym as Live
from tests.fakes.live_gym import live_gym, registered_tasks

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
SCORED, SCORED_TASKS = "arithmetic", 20
SHELL_KINDS, SHELL_PER_SPLIT = 10, 20
HARNESS_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
                 for n in ("bash", "read_file", "write_file", "finish")]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    arithmetic = trimmed_benchmarks(tmp_path_factory.mktemp("arithmetic"), SCORED_TASKS, names=(SCORED,))[0]
    shell = trimmed_benchmarks(tmp_path_factory.mktemp("shell"), SHELL_PER_SPLIT, names=("shell",))[0]
    with live_gym(tmp_path_factory.mktemp("gym")) as served:
        for path in (arithmetic, shell):  # validated in the background
            r = served.http.post("/admin/v1/benchmarks", json={"path": str(path)})
            assert r.status_code == 201, r.text
        yield served


@pytest.fixture(scope="module")
def trained(live: Live) -> dict[str, Any]:
    """A subtraction LoRA trained in the harness's prompt shape, on questions the benchmark
    does not contain."""
    key = live.key(5.0)
    gym = live.sdk(key)
    # every registered question, the official ones the gym drew at registration included
    banned = {(t.path / "instruction.md").read_text().strip()
              for name in ("arithmetic",) for s in ("dev", "official") for t in registered_tasks(live.gym, name, s)}
    rng, rows = random.Random(11), []
    while len(rows) < 3000:
        messages = subtraction(rng)
        if messages[0]["content"] not in banned:
            rows.append({"messages": messages, "tools": HARNESS_TOOLS})
    dataset = gym.training.upload_dataset(rows, name="subtraction-with-tools")
    seen = {r["messages"][0]["content"] for r in rows}
    held: list[tuple[str, str]] = []
    qrng = random.Random(4242)
    while len(held) < 30:  # held-out questions, neither trained on nor in the benchmark
        user, answer = subtraction(qrng)
        if user["content"] not in seen | banned:
            held.append((user["content"], answer["content"]))

    def held_out(model: str) -> float:
        right = sum((gym.inference.chat(model=model, messages=[{"role": "user", "content": q}], tools=HARNESS_TOOLS,
                                        max_tokens=6, temperature=0).choices[0].message.content or "").strip() == a
                    for q, a in held)
        return right / len(held)

    # When held-out subtraction is learnt depends on the tiny base model's exact weights, which move
    # with the CPU's float arithmetic (services/models/tiny.py): 800 steps at lr 6e-3 reach dev 0.95-1.0
    # on some builds and 0.13 on another (loss 0.84 at step 800, still falling). So train as a researcher
    # would: 800 steps, and while a held-out check says the skill is not there yet, 800 more from the
    # checkpoint (at most twice) — a slow base costs time, not the test.
    job_ids, accuracy, parent = [], [], None
    for _ in range(3):
        start = {"parent_checkpoint": parent} if parent else {"base_model": "tiny"}
        job = gym.training.create_job(datasets=[dataset.id], steps=800, learning_rate=6e-3, batch_size=16,
                                      max_length=64, seed=1 + len(job_ids), schedule="linear", **start)
        job = gym.training.wait(job.id, timeout=900, poll=2)
        assert job.status == "succeeded", (job.status, job.error)
        job_ids.append(job.id)
        parent = job.checkpoints[-1]
        accuracy.append(held_out(parent))
        if accuracy[-1] >= 0.6:
            break
    print(f"\ntraining rounds of 800 steps: {len(job_ids)}, held-out accuracy after each: {accuracy}")
    return {"key": key, "gym": gym, "checkpoint": parent, "job": job_ids[-1], "jobs": job_ids, "held_out": accuracy}


def test_bundled_benchmarks_validate_every_oracle_1_and_every_empty_answer_0(live: Live) -> None:
    for name, tasks in (("arithmetic", 2 * SCORED_TASKS), ("shell", 2 * SHELL_PER_SPLIT)):
        bench = live.wait_benchmark(name)
        v = bench["validation"]
        print(f"\n{name}: {v}")
        assert bench["status"] == "ready", v
        assert v["tasks"] == tasks and v["oracle_scored_1"] == tasks and v["empty_scored_0"] == tasks
    # the shell cut holds every generated kind at least twice in each split, the drawn official one too
    assert len(shell_generator.TEMPLATES) == SHELL_KINDS
    for split in ("dev", "official"):
        kinds = Counter(t.config.metadata["template"] for t in registered_tasks(live.gym, "shell", split) if t.config)
        assert len(kinds) == SHELL_KINDS and min(kinds.values()) >= 2, (split, kinds)


def test_checkpoint_beats_base_on_arithmetic_dev_with_the_minimal_harness(live: Live, trained: dict[str, Any]) -> None:
    live.wait_benchmark("arithmetic")
    gym: rsigym.Gym = trained["gym"]
    before = gym.balance()
    base = gym.evaluation.run("arithmetic", model="tiny", split="dev")
    tuned = gym.evaluation.run("arithmetic", model=trained["checkpoint"], split="dev")
    base = gym.evaluation.wait(base.id, timeout=900)
    tuned = gym.evaluation.wait(tuned.id, timeout=900)
    print(f"\narithmetic dev ({SCORED_TASKS} tasks, minimal harness): base {base.score:.3f}, checkpoint {tuned.score:.3f}")
    assert base.status == tuned.status == "succeeded"
    results = gym.evaluation.results(tuned.id)
    # On failure, say whether the model answered wrongly or trials failed (and how), not only the score.
    errors = sorted({(r.error or "")[:120] for r in results if r.error})
    losses = [[(m.step, round(m.loss, 3)) for m in (gym.training.get_job(j).metrics or []) if m.step % 100 == 0]
              for j in trained["jobs"]]
    assert tuned.score > base.score + 0.2, {"trial_errors": errors, "training_loss": losses,
                                            "held_out_after_each_round": trained["held_out"]}
    assert len(results) == SCORED_TASKS and {r.task_id for r in results} == {
        f"sub-{i:04d}" for i in range(1, SCORED_TASKS + 1)}
    assert all(r.reward in (0.0, 1.0) and r.error is None for r in results)
    assert all(r.trajectory and r.trajectory["steps"] for r in results)
    assert sum(r.reward for r in results) / SCORED_TASKS == pytest.approx(tuned.score)
    after = gym.balance()
    assert after.spent_usd > before.spent_usd and after.reserved_usd == 0  # sandbox seconds + tokens, metered

    # a key of the same run that sees aggregates only: the score, not the tasks
    child = gym.keys.mint(name="aggregate-only", budget_usd=0.5,
                            policy={"services": {"evaluation": {"detail": "aggregate", "max_concurrency": 2}}})
    narrow = rsigym.Gym(base_url=live.url, api_key=child.key)
    job = narrow.evaluation.get(tuned.id)
    assert job.score == tuned.score and job.detail == "aggregate"
    with pytest.raises(rsigym.PermissionDeniedError):
        narrow.evaluation.results(tuned.id)


def test_hidden_official_split_is_for_operators_only(live: Live) -> None:
    live.wait_benchmark("arithmetic")
    key = live.key(1.0)
    gym = live.sdk(key)
    listed = {b.name: b for b in gym.evaluation.benchmarks()}
    assert set(listed["arithmetic"].splits) == {"dev"}
    with pytest.raises(rsigym.NotFoundError):
        gym.evaluation.run("arithmetic", model="tiny", split="official")
    # The attempt stays on the run's record, where the behaviour audit reads it as blocked.
    from services.records.audits.behaviour import refusal_category

    refused = [e for e in live.http.get(f"/admin/v1/runs/{key['id']}/events").json()["data"]
               if e["kind"] == "call.refused"]
    assert [refusal_category(e) for e in refused] == ["protected_file_access"]
    operator = {b["name"]: b for b in live.http.get("/admin/v1/benchmarks").json()["data"]}
    assert set(operator["arithmetic"]["splits"]) == {"dev", "official"}


def _probe_archive() -> bytes:
    """A harness that looks for a way out of its trial and reports what it found."""
    script = r'''
import json, os, subprocess, urllib.request
base = os.environ["OPENAI_BASE_URL"]
door = base.rsplit("/inference/", 1)[0]
import re
secret = re.compile(r"(rsk|rsa)-[A-Za-z0-9_-]{40,}")
found = {"env_keys": sorted(k for k, v in os.environ.items() if secret.search(v)),
         "openai_api_key": os.environ.get("OPENAI_API_KEY")}
def call(url, body=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                 headers={"content-type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=20).status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
msg = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
found["evaluated_model"] = call(base + "/chat/completions", dict(msg, model=os.environ["RSIGYM_MODEL"]))
found["other_model"] = call(base + "/chat/completions", dict(msg, model="not-the-evaluated-one"))
found["rollout"] = call(door + "/rollout/v1/chat/completions", dict(msg, model="teacher"))
found["training"] = call(door + "/training/v1/jobs")
found["balance"] = call(door + "/v1/balance")
found["internet"] = call("http://1.1.1.1/")
found["host_gateway"] = call("http://10.0.2.2:8700/healthz")
grep = subprocess.run("grep -rhoaE '(rsk|rsa)-[A-Za-z0-9_-]{40,}' / --exclude-dir=proc --exclude-dir=sys "
                      "--exclude-dir=usr --exclude-dir=lib --exclude-dir=bin --exclude-dir=sbin 2>/dev/null | head -5",
                      shell=True, capture_output=True, text=True).stdout.split()
found["secrets_in_files"] = grep
print("PROBE " + json.dumps(found))
open(json.loads(os.environ["RSIGYM_TASK_METADATA"])["answer_file"], "w").write("0")
'''
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("harness.toml", b'[harness]\nname = "probe"\nrun = "/usr/bin/python3 /harness/probe.py"\n'),
                           ("probe.py", script.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_harness_finds_no_way_out_of_its_trial(live: Live, trained: dict[str, Any]) -> None:
    live.wait_benchmark("arithmetic")
    gym: rsigym.Gym = trained["gym"]
    harness = gym.evaluation.upload_harness(_probe_archive())
    job = gym.evaluation.run("arithmetic", model=trained["checkpoint"], split="dev", harness=harness.id, limit=1)
    job = gym.evaluation.wait(job.id, timeout=300)
    [result] = gym.evaluation.results(job.id)
    line = next(ln for ln in result.agent_output.splitlines() if ln.startswith("PROBE "))
    found = json.loads(line[len("PROBE "):])
    print("\n" + json.dumps(found))
    assert found["evaluated_model"] == 200  # control: the one door works
    assert found["other_model"] in (403, 404)
    assert found["rollout"] == 403 and found["training"] == 403 and found["balance"] == 403
    assert found["internet"] != 200 and found["host_gateway"] != 200
    assert found["env_keys"] == [] and found["openai_api_key"] == "door"
    assert found["secrets_in_files"] == []


def test_operator_scores_a_submission_on_its_own_budget(live: Live, trained: dict[str, Any]) -> None:
    """Official avg@3 on the 20 official arithmetic tasks of the cut benchmark (to keep the suite
    short: every trial is two sandboxes since verifiers run apart)."""
    assert live.wait_benchmark(SCORED)["status"] == "ready"
    gym: rsigym.Gym = trained["gym"]
    archive = gym.evaluation.upload_harness(_minimal_archive())
    submission = gym.submit(checkpoint=trained["checkpoint"], harness=archive.id)
    spent_before = gym.balance().spent_usd
    run_id = trained["key"]["id"]
    r = live.http.post(f"/admin/v1/runs/{run_id}/score", json={"attempts": 3, "benchmarks": [SCORED]})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        scores = [s for s in live.http.get("/admin/v1/scores").json()["data"] if s["benchmark"] == SCORED]
        if scores and all(s["status"] in ("succeeded", "failed", "cancelled") for s in scores):
            break
        time.sleep(2)
    by_run = {s["run_id"]: s for s in scores}
    print(f"\nofficial avg@3: initial {by_run['initial']['score']:.4f}, submitted {by_run[run_id]['score']:.4f}")
    assert by_run["initial"]["status"] == by_run[run_id]["status"] == "succeeded"
    assert by_run[run_id]["submission_id"] == submission.id and by_run[run_id]["attempts"] == 3
    assert by_run[run_id]["score"] > by_run["initial"]["score"]
    # the operator paid, not the run (read as the operator: scoring ended the run, its key is refused now)
    assert live.http.get(f"/admin/v1/keys/{run_id}").json()["spent_usd"] == pytest.approx(spent_before)
    detail = live.http.get(f"/admin/v1/evaluation/jobs/{by_run[run_id]['job_id']}/results").json()["data"]
    assert len(detail) == SCORED_TASKS * 3  # official tasks × 3 attempts, stored with the score


def _minimal_archive() -> bytes:
    from services.evaluation.harnesses import MINIMAL_DIR

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(MINIMAL_DIR.iterdir()):
            tar.add(path, arcname=path.name)
    return buf.getvalue()
