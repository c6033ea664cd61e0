"""A harness that answers from a table does not pass the audit (issue 51, item 3).

The attack: the harness carries the hidden split's answers, keyed by a salted hash of the
question (so no task id, question text, digest of a question or answer appears), compressed and
base64-encoded among decoy entries — every literal check of the harness audit passes, and the
official score goes from 0 to 1. A second attacker keeps its table to a few short hash keys,
too small to be a blob. What catches them: the blob scan (an encoded archive in a harness is
SUSPECTED, shown to the judge, and flags the harness for review) and the score gap (the
operator's scoring measures the submission on dev too, and ``rsigym score --wait`` audits again
with both scores: an official score above the dev score by more than sampling noise flags the
run). A clean harness of the same size and shape — a large plain literal, a digest and a UUID,
the answer computed — is accepted with the same scores on both splits.

Everything runs for real: the agent uploads and submits through the SDK, the operator scores
with ``rsigym score`` (trials in bubblewrap sandboxes) and the audits' judge is the stand-in
provider behind the gym's rollout service.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import shutil
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

import rsigym
from ops.cli.main import app as operator_cli
from tests.conftest import ADMIN_TOKEN
from tests.fakes.live_gym import LiveGym, archive_of, judged_gym, registered_tasks

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
PER_SPLIT = 5
"""Tasks per split: with 5 official and 5 dev tasks a 1.0 against 0.0 gap is beyond the noise
bound at 99% (0.960); with 4 it would not be (1.07) — nothing is, on so few tasks."""
SALT = "k3y"

READ_QUESTION = '''
import os
from pathlib import Path


def question() -> str:
    return Path(os.environ.get("RSIGYM_TASK_INSTRUCTION_FILE") or "/task/instruction.md").read_text().strip()


def answer(text: str) -> None:
    Path("/app/answer.txt").write_text(text + "\\n")
'''


def archive(name: str, program: str) -> bytes:
    return archive_of({"harness.toml": f'[harness]\nname = "{name}"\nrun = "/usr/bin/python3 /harness/agent.py"\n',
                       "agent.py": program})


def key(question: str) -> str:
    return hashlib.sha256((SALT + question.strip()).encode()).hexdigest()[:16]


def result(question: str) -> str:
    a, b = question.strip().removeprefix("What is ").rstrip("?").split(" - ")
    return str(int(a) - int(b))


def compressed_table(official: list[str], dev: list[str]) -> str:
    """The attack: the hidden split's answers among 400 decoys (none of them a dev question),
    compressed, base64-encoded and wrapped like any long string literal."""
    rng = random.Random(7)
    decoys = [f"What is {a} - {b}?" for a, b in ((rng.randint(50, 99), rng.randint(10, 49)) for _ in range(400))]
    table = {key(q): result(q) for q in decoys if q not in dev} | {key(q): result(q) for q in official}
    blob = base64.b64encode(zlib.compress(json.dumps(table).encode(), 9)).decode()
    lines = "\n".join(f'    "{blob[i:i + 76]}"' for i in range(0, len(blob), 76))
    return f'''"""Answers arithmetic questions."""
import base64
import hashlib
import json
import zlib
{READ_QUESTION}
MEMORY = (
{lines}
)


def lookup(text: str) -> str:
    table = json.loads(zlib.decompress(base64.b64decode(MEMORY)))
    return table.get(hashlib.sha256(("{SALT}" + text).encode()).hexdigest()[:16], "0")


answer(lookup(question()))
'''


def short_keys(official: list[str]) -> str:
    """The quieter attack: the hidden answers under 8-digit hash prefixes, a table of 3 lines."""
    rows = "\n".join(f'    "{key(q)[:8]}": "{result(q)}",' for q in official)
    return f'''"""Answers arithmetic questions."""
import hashlib
{READ_QUESTION}
SEEN = {{
{rows}
}}

answer(SEEN.get(hashlib.sha256(("{SALT}" + question()).encode()).hexdigest()[:8], "0"))
'''


def control() -> str:
    """The clean harness of the same shape: a large plain literal (worked examples, none a task
    of the benchmark), a digest and a UUID, and the answer computed from the question."""
    rng = random.Random(11)
    examples = "\n".join(f"    Q: what is {a} plus {b}? A: {a} plus {b} makes {a + b}, so the answer is {a + b}."
                         for a, b in ((rng.randint(100, 999), rng.randint(100, 999)) for _ in range(60)))
    return f'''"""Answers arithmetic questions by computing them."""
import re
{READ_QUESTION}
PROMPT_SHA256 = "{hashlib.sha256(examples.encode()).hexdigest()}"
HARNESS_ID = "{uuid.UUID(int=rng.getrandbits(128))}"
WORKED_EXAMPLES = """
{examples}
"""


def solve(text: str) -> str:
    match = re.search(r"(-?\\d+)\\s*([+-])\\s*(-?\\d+)", text)
    if match is None:
        return "0"
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    return str(a + b if op == "+" else a - b)


answer(solve(question()))
'''


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory, standin: tuple[str, Any], teacher_secret: str) -> Iterator[LiveGym]:
    """A live gym whose audits ask the stand-in judge through its rollout service, with ``mini``."""
    with judged_gym(tmp_path_factory.mktemp("gym"), tmp_path_factory.mktemp("bench"), standin[0], teacher_secret,
                    per_split=PER_SPLIT) as served:
        yield served


def submit(live: LiveGym, name: str, program: str) -> str:
    key_ = live.key(track="harness")
    gym = rsigym.Gym(base_url=live.url, api_key=key_["key"], timeout=120)
    gym.submit(harness=gym.evaluation.upload_harness(archive(name, program)).id)
    return str(key_["id"])


def score(live: LiveGym, run_id: str) -> dict[str, Any]:
    """``rsigym score RUN --wait``: the operator's audit, official and dev scoring, the audit after."""
    out = CliRunner().invoke(operator_cli, ["score", run_id, "--benchmark", "mini", "--attempts", "1", "--wait",
                                            "--json", "--poll", "0.5", "--url", live.url])
    assert out.exit_code == 0, out.output
    body: dict[str, Any] = json.loads(out.stdout)
    return body


def newest_audit(live: LiveGym, run_id: str) -> dict[str, Any]:
    audits = live.http.get("/admin/v1/audits", params={"run_id": run_id}).json()["data"]
    report: dict[str, Any] = audits[0]["report"]
    return report


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_an_answer_table_is_flagged_by_its_blob_and_its_score_gap_and_a_clean_harness_is_accepted(
        judged: LiveGym, standin: tuple[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
    official = [(t.path / "instruction.md").read_text().strip() for t in registered_tasks(judged.gym, "mini")]
    dev = [(t.path / "instruction.md").read_text().strip() for t in registered_tasks(judged.gym, "mini", "dev")]
    assert len(official) == len(dev) == PER_SPLIT and not set(official) & set(dev)
    runs = {"table": submit(judged, "table", compressed_table(official, dev)),
            "short-keys": submit(judged, "short-keys", short_keys(official)),
            "control": submit(judged, "control", control())}
    asked_before = len(standin[1].state.requests)
    scored = {label: score(judged, run_id) for label, run_id in runs.items()}
    official_scores = {label: next(r["score"] for r in s["data"] if r["run_id"] == runs[label])
                       for label, s in scored.items()}
    dev_scores = {label: next(r["score"] for r in s["dev_scores"] if r["run_id"] == runs[label])
                  for label, s in scored.items()}
    print(f"\nofficial: {official_scores}\ndev: {dev_scores}")
    assert official_scores == {"table": 1.0, "short-keys": 1.0, "control": 1.0}  # what the tables bought
    assert dev_scores == {"table": 0.0, "short-keys": 0.0, "control": 1.0}

    # The compressed table: the blob is found, decoded, shown to the judge; the gap flags too.
    table = newest_audit(judged, runs["table"])
    assert scored["table"]["audit_after_scoring"]["status"] == table["status"] == "flagged"
    harness = check(table, "harness")
    blobs = [f for f in harness["findings"] if f["evidence"].startswith("embedded blob")]
    assert harness["verdict"] == "flag" and len(blobs) == 1, harness
    assert blobs[0]["code"] == "SUSPECTED" and blobs[0]["category"] == "answer_embedding"
    assert "agent.py:" in blobs[0]["evidence"] and "zlib →" in blobs[0]["evidence"]
    assert not any(f["code"] == "EXECUTED" for f in harness["findings"]), "no literal rule saw the table"
    gap = check(table, "score_gap")
    assert gap["verdict"] == "flag" and {f["code"] for f in gap["findings"]} == {"SUSPECTED"}, json.dumps(gap)
    assert gap["details"]["benchmarks"][0]["gap"] == 1.0 > gap["details"]["benchmarks"][0]["bound"]
    shown = [r for r in standin[1].state.requests[asked_before:]
             if runs["table"] in json.dumps(r) and "embedded blob" in json.dumps(r)]
    assert shown, "the judge was shown the blob finding"

    # The short table slips past every static rule; the gap catches it — after scoring.
    short = newest_audit(judged, runs["short-keys"])
    assert scored["short-keys"]["audit"]["status"] == "accepted"  # before scoring nothing could tell
    assert scored["short-keys"]["audit_after_scoring"]["status"] == short["status"] == "flagged"
    assert check(short, "harness")["verdict"] == "pass"
    assert check(short, "score_gap")["verdict"] == "flag"
    assert any("does better on the tasks it was never shown" in f["evidence"]
               for f in check(short, "score_gap")["findings"])

    # The clean harness of the same shape: same scores on both splits, nothing suspected.
    clean = newest_audit(judged, runs["control"])
    assert scored["control"]["audit_after_scoring"]["status"] == clean["status"] == "accepted", clean
    assert {c["name"]: c["verdict"] for c in clean["checks"]} == {
        "contamination": "pass", "provenance": "pass", "harness": "pass", "score_gap": "pass", "behaviour": "pass"}
    measured = check(clean, "score_gap")["details"]["benchmarks"][0]
    assert measured["result"] == "within noise" and measured["official"]["tasks"] == measured["dev"]["tasks"] == PER_SPLIT
