"""The harness audit's static checks, played as an agent would cheat: answer tables, per-task
branches, calls to other models — each found with file:line evidence — and the shipped minimal
harness passing untouched.

Benchmark items come from the shipped benchmarks (benchmarks/) through the contamination module's
``benchmark_items`` — the same list the audit passes in — plus one synthetic task with a long
question and a distinctive answer."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from kit.config import GymConfig, RolloutModel
from kit.errors import Unprocessable
from services.evaluation.archives import build_archive
from services.evaluation.harnesses import MINIMAL_DIR, build_minimal_archive
from services.records.audits.contamination import Item, benchmark_items
from services.records.audits.findings import CheckResult, Finding
from services.records.audits.harness_check import check_harness, distinctive_answer, read_archive, scan_harness, words

REPO = Path(__file__).resolve().parents[4]
BENCHMARKS = REPO / "benchmarks"


SYNTHETIC = [
    Item("trivia-0007", "trivia", "official", "question",
         "Which river flows through the ancient city of Quillmarsh according to the 1893 atlas?"),
    Item("trivia-0007", "trivia", "official", "answer", "The Silverrun River"),
]
ITEMS = benchmark_items(BENCHMARKS) + SYNTHETIC
CONFIG = GymConfig(rollout={"models": [RolloutModel(name="teacher", litellm_model="openai/gpt-4o-mini",
                                                    input_usd_per_mtok=1, output_usd_per_mtok=2)]})


def harness(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, bytes]]:
    """An uploaded-style archive of ``files`` (plus a manifest), read back the way the audit reads it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "harness.toml").write_text('[harness]\nname = "mine"\nrun = "python3 /harness/agent.py"\n')
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    out = tmp_path / "h.tar.gz"
    build_archive(src, out)
    return read_archive(out)


def executed(result: CheckResult, category: str) -> list[Finding]:
    return [f for f in result.findings if f.category == category and f.code == "EXECUTED"]


def test_the_shipped_items_are_what_the_tests_assume() -> None:
    ids = {i.task for i in ITEMS}
    # the repository's dev splits (their official splits are drawn by a gym at registration)
    assert {"arithmetic/sub-0001", "shell/sh-0001"} <= ids and len(ids) > 100
    assert any(i.field == "answer" and i.task == "arithmetic/sub-0001" and i.text == "7" for i in ITEMS)


def test_an_answer_table_keyed_by_task_id_is_flagged_with_file_and_line(tmp_path: Path) -> None:
    answers = {i.task_id: i.text for i in ITEMS if i.field == "answer" and i.benchmark == "arithmetic"}
    table = "{\n" + ",\n".join(f'  "{t}": "{a}"' for t, a in sorted(answers.items())[:30]) + "\n}\n"
    files = harness(tmp_path, {"agent.py": "import json\nANSWERS = json.load(open('/harness/data/a.json'))\n",
                               "data/a.json": table})
    result = scan_harness(files, ITEMS, config=CONFIG)
    assert result.verdict == "flag"
    (table_finding,) = [f for f in executed(result, "answer_embedding") if "answer table" in f.evidence]
    first = sorted(answers)[0]
    assert f"arithmetic/{first}" in table_finding.task_ids and len(table_finding.task_ids) == 30
    assert f'data/a.json:2: ""{first}": "{answers[first]}","' in table_finding.evidence
    assert table_finding.submission is True


def test_special_casing_a_question_string_is_flagged(tmp_path: Path) -> None:
    question = (BENCHMARKS / "arithmetic" / "dev" / "sub-0001" / "instruction.md").read_text().strip()
    code = ("def solve(instruction):\n"
            "    text = instruction.strip()\n"
            f"    if text == {question!r}:\n"
            "        return 'seven'\n"
            "    return None\n")
    result = scan_harness(harness(tmp_path, {"agent.py": code}), ITEMS, config=CONFIG)
    assert result.verdict == "flag"
    (f,) = [f for f in executed(result, "answer_embedding") if "question text" in f.evidence]
    assert f.task_ids == ["arithmetic/sub-0001"]
    assert f"agent.py:3: \"if text == {question!r}:\"" in f.evidence


def test_special_casing_a_long_question_quoted_in_part_and_by_hash_is_flagged(tmp_path: Path) -> None:
    question = SYNTHETIC[0].text
    prefix = hashlib.sha256(question.encode()).hexdigest()[:16]
    code = ("import hashlib\n"
            "def special(instruction):\n"
            f"    if hashlib.sha256(instruction.encode()).hexdigest().startswith('{prefix}'):\n"
            "        return 'x'\n"
            "    if 'RIVER flows through the ancient city of  quillmarsh, according' in instruction:\n"
            "        return 'y'\n")
    result = scan_harness(harness(tmp_path, {"agent.py": code}), ITEMS, config=CONFIG)
    found = {f.evidence.split(":", 1)[0]: f for f in executed(result, "answer_embedding")}
    assert found["hash of a benchmark instruction (per-task special case)"].task_ids == ["trivia/trivia-0007"]
    assert "agent.py:3:" in found["hash of a benchmark instruction (per-task special case)"].evidence
    assert "agent.py:5:" in found["benchmark question text quoted (per-task special case)"].evidence


def test_a_distinctive_answer_is_flagged_alone_a_short_one_only_next_to_its_task(tmp_path: Path) -> None:
    files = harness(tmp_path, {"notes.txt": "hint: the silverrun river\n", "agent.py": "RETRIES = 7\nWAIT = 62\n"})
    result = scan_harness(files, ITEMS, config=CONFIG)
    (f,) = executed(result, "answer_embedding")
    assert f.task_ids == ["trivia/trivia-0007"] and 'notes.txt:1: "hint: the silverrun river"' in f.evidence
    assert distinctive_answer(words("The Silverrun River"))
    assert not any(distinctive_answer(words(a)) for a in ("7", "62", "grape", "1000", "true"))
    assert distinctive_answer(words("123456")) and distinctive_answer(words("x9f3k2"))


def test_calling_an_external_model_is_reported_with_evidence_but_does_not_flag_alone(tmp_path: Path) -> None:
    code = ("import os\n"
            "from openai import OpenAI\n"
            "client = OpenAI(base_url='https://api.openai.com/v1', api_key='sk-live-0123456789abcdefghij')\n"
            "reply = client.chat.completions.create(model='openai/gpt-4o-mini', messages=[])\n"
            "DOOR = os.environ['OPENAI_BASE_URL']  # the platform's door: fine\n"
            "LOCAL = 'http://127.0.0.1:8700/inference/v1'\n"
            "MIRROR = 'http://203.0.113.7/answers.json'\n")
    result = scan_harness(harness(tmp_path, {"agent.py": code}), ITEMS, config=CONFIG)
    assert result.verdict == "pass"  # SUSPECTED alone never flags
    codes = {f.category: f for f in result.findings}
    assert all(f.code == "SUSPECTED" for f in result.findings)
    others = [f for f in result.findings if f.category == "other_models_at_evaluation"]
    evidence = " ".join(f.evidence for f in others)
    for where in ("agent.py:2:", "agent.py:3:", "agent.py:4:"):
        assert where in evidence
    assert "agent.py:6:" not in evidence and "agent.py:5:" not in evidence
    assert "agent.py:7:" in codes["network_answer_fetch"].evidence
    assert "agent.py:3:" in codes["credential_use"].evidence


def test_reading_protected_paths_flags_in_code_and_is_suspected_in_docs(tmp_path: Path) -> None:
    files = harness(tmp_path, {"agent.py": "print(open('/solution/solve.sh').read())\n"
                                           "open('/logs/verifier/reward.txt', 'w').write('1')\n",
                               "README.md": "The verifier reads /tests/test.sh.\n"})
    result = scan_harness(files, ITEMS, config=CONFIG)
    assert result.verdict == "flag"
    (read,) = executed(result, "protected_file_access")
    assert "agent.py:1:" in read.evidence
    (reward,) = executed(result, "reward_manipulation")
    assert "agent.py:2:" in reward.evidence
    assert any(f.code == "SUSPECTED" and "README.md:1:" in f.evidence for f in result.findings)


def test_template_text_shared_by_many_tasks_is_not_a_special_case(tmp_path: Path) -> None:
    files = harness(tmp_path, {"prompt.txt": "Write only the answer (nothing else) to /app/answer.txt.\n"})
    assert scan_harness(files, ITEMS, config=CONFIG).findings == []


def test_the_shipped_minimal_harness_passes(tmp_path: Path) -> None:
    from services.records.audits.context import AuditContext

    archive = build_minimal_archive(tmp_path / "minimal.tar.gz")
    result = scan_harness(read_archive(archive), ITEMS, config=CONFIG)
    assert result.verdict == "pass"
    assert [f for f in result.findings if f.code == "EXECUTED"] == []
    assert result.details["files"] == len([p for p in MINIMAL_DIR.rglob("*") if p.is_file()])
    ctx = AuditContext(store=None, config=CONFIG, data_dir=tmp_path, events=None, run_id="key_x")  # type: ignore[arg-type]
    assert check_harness(ctx, {"harness": "minimal"}, ITEMS).verdict == "pass"


def test_a_hostile_archive_is_refused_not_extracted(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in (("harness.toml", b'[harness]\nname = "x"\nrun = "true"\n'), ("../escape.py", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    path = tmp_path / "evil.tar.gz"
    path.write_bytes(buf.getvalue())
    with pytest.raises(Unprocessable):
        read_archive(path)
    assert not (tmp_path.parent / "escape.py").exists()
