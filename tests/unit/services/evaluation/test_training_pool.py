"""A benchmark's training pool: questions of its form that no task asks, published to agents.

Registration scans the pool with the contamination audit's own scanner: a pool that would let an
agent train on a task's question (hidden or not) is refused and nothing is registered. The bundled
arithmetic pool, answered and trained on whole, is never flagged by the audit. Registry tests run on
SQLite and PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select

from kit.config import AuditConfig
from kit.errors import Unprocessable
from services.evaluation.benchmarks import pool_questions
from services.evaluation.official_splits import SEED_FILE
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.tables import BenchmarkRow
from services.records.audits.contamination import row_text, scan, task_items
from storage.store import Store
from tests.fakes.live_gym import mini_benchmark

ARITHMETIC = Path(__file__).resolve().parents[4] / "benchmarks" / "arithmetic"


def _registered(store: Store, root: Path) -> tuple[list[str], list[str]]:
    """(benchmark rows in the store, entries under the registry's directory but the gym's seed)."""
    with store.transaction() as s:
        names = list(s.scalars(select(BenchmarkRow.name)))
    return names, sorted(p.name for p in root.iterdir() if p.name != SEED_FILE) if root.exists() else []


def test_the_bundled_pool_answered_whole_is_never_flagged(sqlite_store: Store, tmp_path: Path) -> None:
    """What an agent does with the pool (every question, with its answer, in the harness's prompt
    shape) scanned as the audit scans a run's datasets: not one task of any split matches, the
    official tasks the gym drew at registration included."""
    _, bench = BenchmarkRegistry(sqlite_store, tmp_path / "registry").register(ARITHMETIC)
    assert len(bench.splits["official"].tasks) == 60
    questions = pool_questions(bench)
    asked = {(t.path / "instruction.md").read_text().strip() for _, t in bench.tasks()}
    assert len(questions) == len(set(questions)) == 2000 and not asked & set(questions)
    rows = []
    for q in questions:
        a, b = (int(x) for x in q.removeprefix("What is ").removesuffix("?").split(" - "))
        assert 10 <= b < a <= 99  # the benchmark's own form: training on it teaches the benchmark's skill
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(a - b)}]})
    audit = AuditConfig()
    report = scan((("pool", n, row_text(r)) for n, r in enumerate(rows, 1)), task_items(bench), audit.ngram,
                  audit.contamination_threshold)
    assert report.rows_scanned == 2000 and report.contaminated == []


def test_a_pool_holding_a_task_question_is_refused_and_nothing_is_registered(store: Store, tmp_path: Path) -> None:
    bench = mini_benchmark(tmp_path / "src", name="leaky")
    task = sorted((bench / "dev").iterdir())[0]
    question = (task / "instruction.md").read_text().strip()
    with open(bench / "train.jsonl", "a") as pool:  # in another spelling: the audit normalises it
        pool.write(json.dumps({"question": question.upper().replace(" - ", " \u2212 ")}) + "\n")
    root = tmp_path / "registry"
    with pytest.raises(Unprocessable) as refused:
        BenchmarkRegistry(store, root).register(bench)
    assert refused.value.param == "path"
    assert "row 2001" in refused.value.message and f"leaky/{task.name} (dev)" in refused.value.message
    assert _registered(store, root) == ([], [])  # no row, no copy, no staging directory left


@pytest.mark.parametrize("pool, content, expected", [
    ("../outside.jsonl", None, "relative path inside the benchmark"),
    ("/etc/passwd", None, "relative path inside the benchmark"),
    ("train.jsonl", '{"question": "What is 3 - 1?"}\nnot json\n', "line 2: not JSON"),
    ("train.jsonl", '{"prompt": "What is 3 - 1?"}\n', 'line 1: expected {"question"'),
    ("train.jsonl", "\n", "no rows"),
    ("missing.jsonl", None, "not a regular file"),
])
def test_bad_pools_are_refused_naming_the_problem(store: Store, tmp_path: Path, pool: str, content: str | None,
                                                   expected: str) -> None:
    bench = mini_benchmark(tmp_path / "src", name="bad")
    (tmp_path / "src" / "outside.jsonl").write_text('{"question": "What is 3 - 1?"}\n')
    toml = bench / "benchmark.toml"
    toml.write_text(toml.read_text().replace('pool = "train.jsonl"', f'pool = "{pool}"'))
    if content is not None:
        (bench / "train.jsonl").write_text(content)
    root = tmp_path / "registry"
    with pytest.raises(Unprocessable, match="benchmark refused") as refused:
        BenchmarkRegistry(store, root).register(bench)
    assert expected in refused.value.message
    assert _registered(store, root) == ([], [])


def test_a_symlinked_pool_is_refused(store: Store, tmp_path: Path) -> None:
    """A pool that points at a host file (the registry copies without following links) is refused."""
    bench = mini_benchmark(tmp_path / "src", name="linked")
    (bench / "train.jsonl").unlink()
    os.symlink("/etc/hostname", bench / "train.jsonl")
    with pytest.raises(Unprocessable, match="not a regular file"):
        BenchmarkRegistry(store, tmp_path / "registry").register(bench)


def test_registration_records_the_pool(store: Store, tmp_path: Path) -> None:
    registry = BenchmarkRegistry(store, tmp_path / "registry")
    row, _ = registry.register(mini_benchmark(tmp_path / "src", name="pooled"))
    pool = (ARITHMETIC / "train.jsonl").read_bytes()
    assert row.training_pool == {"path": "train.jsonl", "rows": 2000, "sha256": hashlib.sha256(pool).hexdigest()}
    assert registry.pool_path("pooled").read_bytes() == pool
    assert registry.pool_path("pooled").is_relative_to(tmp_path / "registry")  # the registered copy

    bare = mini_benchmark(tmp_path / "src2", name="bare")
    (bare / "train.jsonl").unlink()
    toml = bare / "benchmark.toml"
    toml.write_text(toml.read_text().replace('\n[training]\npool = "train.jsonl"\n', ""))
    assert registry.register(bare)[0].training_pool is None
    with pytest.raises(Exception, match="has no training pool"):
        registry.pool_path("bare")
    shutil.rmtree(tmp_path / "src2")
