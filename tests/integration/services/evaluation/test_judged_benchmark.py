"""A judged benchmark end to end (issue 54, item 3), with the offline config's stand-in judge.

Two tasks ask an arithmetic question; the agent writes its answer to /app/answer.txt. The
verifier (tests/test.sh) asks the judge, at ``$RSIGYM_JUDGE_URL/chat/completions``, to grade the
answer; the stand-in (services/rollout/standin.py) answers the question's arithmetic, and the
verifier scores 1 when that is the answer given. The test proves: registration validates it
(oracle 1, empty answer 0) and refuses a judge outside the rollout catalogue; every trial's
result records the judge's model and the prompts sent; the judge's calls are metered on a judge
key below the operator's key, never on the run's; and the agent's sandbox has no way to the
judge (no judge variables, and its inference door refuses /rollout)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from kit.config import load_config
from storage.tables import ApiKey, LedgerEntry
from tests.fakes.live_gym import LiveGym, harness_archive, live_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
NAME = "judged-mini"
QUESTIONS = {"dev": ("add-1", "17 + 25", "42"), "official": ("sub-1", "30 - 12", "18")}

TEST_SH = r'''#!/bin/bash
# Ask the benchmark's judge whether the answer is right; always writes 0 or 1.
mkdir -p /logs/verifier
python3 - <<'PY'
import json, os, urllib.request
path = "/app/answer.txt"
answer = open(path).read().strip() if os.path.isfile(path) else ""
prompt = f"Grade this answer. The question: what is {QUESTION}? The answer given: <<{answer}>>. Reply with the right value only."
body = {"model": os.environ["RSIGYM_JUDGE_MODEL"], "max_tokens": 16,
        "messages": [{"role": "system", "content": "You are a strict grader of arithmetic answers."},
                     {"role": "user", "content": prompt}]}
request = urllib.request.Request(os.environ["RSIGYM_JUDGE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
verdict = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"].strip()
print(f"judge said {verdict!r} for answer {answer!r}")
open("/logs/verifier/reward.txt", "w").write("1" if answer and verdict == answer else "0")
PY
[ -f /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt
exit 0
'''

TASK_TOML = '''schema_version = "1.4"
artifacts = ["/app"]

[task]
name = "rsigym/judged__{task}"
description = "An arithmetic question graded by the benchmark's judge."

[metadata]
kind = "qa"
answer_file = "/app/answer.txt"

[verifier]
timeout_sec = 60.0
environment_mode = "separate"

[agent]
timeout_sec = 60.0

[environment]
workdir = "/app"
'''

HARNESS = r'''python3 - <<'PY'
import json, os, re, urllib.request, urllib.error
question = open(os.environ["RSIGYM_TASK_INSTRUCTION_FILE"]).read()
a, op, b = re.search(r"(\d+) ([+-]) (\d+)", question).groups()
answer = int(a) + int(b) if op == "+" else int(a) - int(b)
base = os.environ["OPENAI_BASE_URL"]
door = base.rsplit("/inference/", 1)[0]
def call(url):
    body = {"model": "judge", "messages": [{"role": "user", "content": "what is 1 + 1?"}], "max_tokens": 4}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=20).status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
found = {"judge_env": sorted(k for k in os.environ if k.startswith("RSIGYM_JUDGE")),
         "rollout": call(door + "/rollout/v1/chat/completions"),
         "rollout_via_inference": call(base + "/../../rollout/v1/chat/completions")}
print("PROBE " + json.dumps(found))
open(json.loads(os.environ["RSIGYM_TASK_METADATA"])["answer_file"], "w").write(f"{answer}\n")
PY
'''


def judged_benchmark(dest: Path, *, judge: str = "judge") -> Path:
    root = dest / NAME
    root.mkdir(parents=True)
    (root / "benchmark.toml").write_text(
        f'name = "{NAME}"\ndescription = "Arithmetic graded by a judge."\nversion = "1.0.0"\n\n'
        '[splits.dev]\nhidden = false\n\n[splits.official]\nhidden = true\n\n'
        f'[judge]\nmodel = "{judge}"\nmax_tokens = 64\n')
    for split, (task, question, answer) in QUESTIONS.items():
        t = root / split / task
        (t / "environment").mkdir(parents=True)
        (t / "tests").mkdir()
        (t / "solution").mkdir()
        (t / "task.toml").write_text(TASK_TOML.replace("{task}", task))
        (t / "instruction.md").write_text(f"What is {question}? Write the answer to /app/answer.txt.\n")
        (t / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")
        (t / "tests" / "test.sh").write_text(TEST_SH.replace("{QUESTION}", question))
        (t / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {answer} > /app/answer.txt\n")
        for script in (t / "tests" / "test.sh", t / "solution" / "solve.sh"):
            script.chmod(0o755)
    return root


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGym]:
    with live_gym(tmp_path_factory.mktemp("gym"), config=load_config(None)) as served:  # the offline stand-ins
        yield served


def _keys(live: LiveGym) -> dict[str, ApiKey]:
    with live.gym.gateway.store.transaction() as s:
        rows = list(s.scalars(select(ApiKey)))
        for r in rows:
            s.expunge(r)
    return {r.id: r for r in rows}


def _rollout_ledger(live: LiveGym) -> list[LedgerEntry]:
    with live.gym.gateway.store.transaction() as s:
        rows = list(s.scalars(select(LedgerEntry).where(LedgerEntry.service == "rollout")))
        for r in rows:
            s.expunge(r)
    return rows


def _assert_judged(result: dict[str, Any], question: str) -> None:
    judge = result["judge"]
    assert judge["model"] == "judge" and judge["calls"] == 1 and not judge["truncated"], judge
    [prompt] = judge["prompts"]
    assert prompt["model"] == "judge" and prompt["path"] == "/rollout/v1/chat/completions"
    assert question in prompt["messages"][-1]["content"]


def test_a_judge_outside_the_rollout_catalogue_is_refused(live: LiveGym, tmp_path: Path) -> None:
    r = live.http.post("/admin/v1/benchmarks", json={"path": str(judged_benchmark(tmp_path, judge="nope"))})
    assert r.status_code == 422, r.text
    assert "'nope' is not in the gym's rollout catalogue" in r.json()["error"]["message"]


def test_a_judged_benchmark_validates_records_its_judge_and_bills_the_operator(
        live: LiveGym, tmp_path: Path) -> None:
    row = live.register(judged_benchmark(tmp_path))
    validation = row["validation"]
    assert row["status"] == "ready", row
    assert validation["oracle_scored_1"] == validation["empty_scored_0"] == validation["tasks"] == 2
    results = live.http.get(f"/admin/v1/evaluation/jobs/{validation['job_id']}/results").json()["data"]
    assert len(results) == 4
    for r in results:  # the oracle's answer and the empty one were both put to the judge
        question = next(q for t, q, _ in QUESTIONS.values() if t == r["task_id"])
        _assert_judged(r, question)
        assert ("<<42>>" in r["judge"]["prompts"][0]["messages"][-1]["content"]) == (
            r["task_id"] == "add-1" and r["attempt"] == 1)

    run = live.key(budget=2.0, track="joint")
    with live.agent(run) as agent:
        harness = agent.post("/evaluation/v1/harnesses", content=harness_archive("judged", HARNESS))
        assert harness.status_code == 201, harness.text
        job = agent.post("/evaluation/v1/jobs", json={"benchmark": NAME, "split": "dev", "model": "tiny",
                                                      "harness": harness.json()["id"]})
        assert job.status_code in (200, 201, 202), job.text
        done = live.wait_job(agent, job.json()["id"])
        assert done["status"] == "succeeded" and done["score"] == 1.0, done
        [result] = agent.get(f"/evaluation/v1/jobs/{done['id']}/results").json()["data"]
    _assert_judged(result, "17 + 25")
    assert "<<42>>" in result["judge"]["prompts"][0]["messages"][-1]["content"]
    # The agent's sandbox had no way to the judge: no judge variables, and its door leads to inference only.
    probe = json.loads(next(ln for ln in result["agent_output"].splitlines() if ln.startswith("PROBE "))[6:])
    assert probe == {"judge_env": [], "rollout": 403, "rollout_via_inference": 403}, probe

    # Every judge call was metered on a judge key below the operator's key; none on the run.
    keys = _keys(live)
    [operator] = [k for k in keys.values() if k.name == "rsigym-operator" and k.parent_id is None]
    ledger = _rollout_ledger(live)
    assert len(ledger) == 5  # four validation trials and the agent's one
    for entry in ledger:
        judge_key = keys[entry.key_id]
        assert judge_key.parent_id == operator.id and entry.run_id == operator.id, judge_key.name
        assert judge_key.name is not None and judge_key.name.endswith(" judge")
        assert judge_key.status == "revoked"  # with the job's other keys
    assert {keys[e.key_id].name for e in ledger} >= {f"evaluation {done['id']} judge"}
    assert not [e for e in ledger if e.run_id == run["id"]]
