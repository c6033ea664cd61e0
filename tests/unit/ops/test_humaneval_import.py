"""The HumanEval importer: splits by seed, a benchmark the gym's loader accepts, refusals."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kit.errors import Conflict, Unprocessable
from ops.benchmark_imports.humaneval import choose_splits, folder_name, import_humaneval, problems
from ops.cli.main import app
from services.evaluation.benchmarks import load_benchmark, validate_structure


def test_splits_are_disjoint_and_the_same_for_one_seed() -> None:
    ids = list(problems())
    assert len(ids) == 164
    a = choose_splits(ids, split_seed=3, dev=64, official=100)
    assert a == choose_splits(ids, split_seed=3, dev=64, official=100)
    assert a != choose_splits(ids, split_seed=4, dev=64, official=100)
    assert len(a["dev"]) == 64 and len(a["official"]) == 100 and not set(a["dev"]) & set(a["official"])
    with pytest.raises(Unprocessable):
        choose_splits(ids, split_seed=0, dev=100, official=65)
    with pytest.raises(Unprocessable):
        choose_splits(ids, split_seed=0, dev=0, official=10)


def test_the_written_benchmark_loads_with_a_hidden_official_split(tmp_path: Path) -> None:
    done = import_humaneval(tmp_path / "he", split_seed=7, dev=5, official=6)
    bench = load_benchmark(done.root)
    validate_structure(bench)
    assert bench.name == "humaneval" and bench.version == "1.0.3"
    assert {n: (s.hidden, len(s.tasks), s.generated) for n, s in bench.splits.items()} == {
        "dev": (False, 5, None), "official": (True, 6, None)}
    assert [t.id for t in bench.splits["dev"].tasks] == [folder_name(i) for i in done.splits["dev"]]
    task = bench.splits["official"].tasks[0]
    problem = problems()[done.splits["official"][0]]
    assert task.config is not None and task.config.metadata["humaneval_task_id"] == problem["task_id"]
    assert [str(a) for a in task.config.artifacts] == ["/app/completion.py"]
    assert (task.path / "instruction.md").read_text().startswith(problem["prompt"].rstrip())
    assert (task.path / "solution" / "completion.py").read_text() == problem["canonical_solution"]
    # the answer key is only where the agent never looks: tests/ and solution/
    assert problem["canonical_solution"].strip() not in (task.path / "task.toml").read_text()
    assert tomllib.loads((done.root / "benchmark.toml").read_text())["source"]["split_seed"] == 7


def test_refuses_a_non_empty_out_dir(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    with pytest.raises(Conflict):
        import_humaneval(tmp_path, dev=1, official=1)


def test_the_cli_writes_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["benchmarks", "import", "humaneval", "--out", str(tmp_path / "he"),
                                      "--dev", "2", "--official", "3", "--split-seed", "1"])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "he" / "official").iterdir())) == 3
    refused = CliRunner().invoke(app, ["benchmarks", "import", "humaneval", "--out", str(tmp_path / "he")])
    assert refused.exit_code == 1
