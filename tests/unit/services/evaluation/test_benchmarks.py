"""The offline benchmarks (benchmarks/arithmetic, benchmarks/shell) and their loader.

The repository holds each benchmark's dev split and training pool; its official split is declared
generated and exists only once a gym registers the benchmark (services/evaluation/official_splits.py),
so the split tests read a registered copy."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.settings import StoreSettings
from services.evaluation.benchmarks import Benchmark, Generated, load_benchmark, validate_structure
from services.evaluation.registry import BenchmarkRegistry
from storage.store import Store, sqlite_url

BENCHMARKS_DIR = Path(__file__).resolve().parents[4] / "benchmarks"
NAMES = ("arithmetic", "shell")


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _question(task_dir: Path) -> str:
    """Instruction plus input files: two tasks with the same digest ask the same question."""
    h = hashlib.sha256((task_dir / "instruction.md").read_bytes())
    app = task_dir / "environment" / "app"
    for rel, data in (_files(app) if app.is_dir() else {}).items():
        h.update(rel.encode() + b"\0" + data)
    return h.hexdigest()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchmarkRegistry]:
    """Both bundled benchmarks registered in a gym's registry (official splits drawn, no validation run)."""
    root = tmp_path_factory.mktemp("gym")
    store = Store(sqlite_url(root), StoreSettings())
    store.migrate()
    registry = BenchmarkRegistry(store, root / "benchmarks")
    for name in NAMES:
        registry.register(BENCHMARKS_DIR / name)
    yield registry
    store.dispose()


@pytest.fixture(scope="module", params=NAMES)
def bench(request: pytest.FixtureRequest, registry: BenchmarkRegistry) -> Benchmark:
    """A bundled benchmark as a gym registered it."""
    return registry.load(request.param)


def test_the_repository_holds_dev_and_declares_official_generated() -> None:
    for name in NAMES:
        shipped = load_benchmark(BENCHMARKS_DIR / name)
        validate_structure(shipped)
        assert {n: split.hidden for n, split in shipped.splits.items()} == {"dev": False, "official": True}
        assert shipped.splits["official"].generated == Generated(name, 60) and not shipped.splits["official"].tasks
        assert not (BENCHMARKS_DIR / name / "official").exists()
        assert shipped.description and shipped.version == "2.0.0" and len(shipped.splits["dev"].tasks) == 60


def test_benchmark_loads_and_validates(bench: Benchmark) -> None:
    validate_structure(bench)
    assert {name: split.hidden for name, split in bench.splits.items()} == {"dev": False, "official": True}
    for split in bench.splits.values():
        assert len(split.tasks) == 60
        assert all(t.config is not None and t.kind == ("qa" if bench.name == "arithmetic" else "shell")
                   for t in split.tasks)


def test_no_question_or_id_shared_between_splits(bench: Benchmark) -> None:
    dev, official = bench.splits["dev"].tasks, bench.splits["official"].tasks
    assert not {t.id for t in dev} & {t.id for t in official}
    assert not {_question(t.path) for t in dev} & {_question(t.path) for t in official}
    assert len({_question(t.path) for t in official}) == len(official)


def test_the_official_split_is_drawn_like_dev(bench: Benchmark) -> None:
    """Same distribution: shell's ten templates in equal shares in both splits, every task rendered
    with the dev tasks' run settings ([agent], [verifier], [environment], artifacts)."""
    dev, official = bench.splits["dev"].tasks, bench.splits["official"].tasks
    metadata = Counter(tuple(sorted(t.config.metadata)) for t in dev if t.config)
    assert Counter(tuple(sorted(t.config.metadata)) for t in official if t.config) == metadata
    if bench.name == "shell":
        templates = Counter(t.config.metadata["template"] for t in official if t.config)
        assert templates == Counter(t.config.metadata["template"] for t in dev if t.config)
        assert set(templates.values()) == {6}
    for task in official:
        assert task.config is not None and dev[0].config is not None
        for table in ("agent", "verifier", "environment"):
            assert getattr(task.config, table) == getattr(dev[0].config, table), (task.id, table)
        assert task.config.artifacts == dev[0].config.artifacts


def test_arithmetic_tasks_have_the_tiny_model_shape(registry: BenchmarkRegistry) -> None:
    bench = registry.load("arithmetic")
    for _, task in bench.tasks():
        assert re.fullmatch(r"sub-\d{4}", task.id)
        match = re.fullmatch(r"What is (\d\d) - (\d\d)\?\n", (task.path / "instruction.md").read_text())
        assert match, task.id
        a, b = map(int, match.groups())
        assert a > b
        assert task.answer_file == "/app/answer.txt"
        assert f"'{a - b}'" in (task.path / "tests" / "test.sh").read_text()


def test_generator_reproduces_committed_files(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(BENCHMARKS_DIR / "generate.py"), "--out", str(tmp_path)],
        check=True, capture_output=True, timeout=120,
    )
    for name in NAMES:
        fresh, committed = _files(tmp_path / name), _files(BENCHMARKS_DIR / name)
        assert sorted(fresh) == sorted(committed), f"{name}: file list differs; rerun benchmarks/generate.py"
        changed = [rel for rel in fresh if fresh[rel] != committed[rel]]
        assert not changed, f"{name}: {changed[:5]} differ; rerun benchmarks/generate.py"


def test_loads_from_tarball(tmp_path: Path) -> None:
    tarball = tmp_path / "arithmetic.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(BENCHMARKS_DIR / "arithmetic", arcname="arithmetic")
    bench = load_benchmark(tarball, extract_to=tmp_path / "x")
    validate_structure(bench)
    assert bench.root == (tmp_path / "x" / "arithmetic").resolve()
    assert [t.id for t in bench.splits["dev"].tasks] == [
        t.id for t in load_benchmark(BENCHMARKS_DIR / "arithmetic").splits["dev"].tasks
    ]


@pytest.fixture
def broken_copy(tmp_path: Path, registry: BenchmarkRegistry) -> Path:
    """A registered copy of arithmetic (both splits on disk), to break."""
    root = tmp_path / "arithmetic"
    shutil.copytree(registry.load("arithmetic").root, root)
    return root


def _problems(root: Path) -> str:
    with pytest.raises(ValueError) as info:
        validate_structure(load_benchmark(root))
    return str(info.value)


def test_broken_tasks_are_refused_with_their_names(broken_copy: Path) -> None:
    dev = sorted(p for p in (broken_copy / "dev").iterdir())
    official = sorted(p for p in (broken_copy / "official").iterdir())
    (dev[0] / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')
    (dev[1] / "task.toml").write_text("this is [not toml\n")
    (official[0] / "tests" / "test.sh").unlink()
    (official[1] / "instruction.md").unlink()
    (official[2] / "solution" / "solve.sh").unlink()

    message = _problems(broken_copy)
    assert "5 problem(s)" in message
    assert f"dev/{dev[0].name}: task.toml refused by harbor: verifier.timeout_sec" in message
    assert f"dev/{dev[1].name}: task.toml refused by harbor" in message
    assert f"official/{official[0].name}: missing tests/test.sh" in message
    assert f"official/{official[1].name}: missing instruction.md" in message
    assert f"official/{official[2].name}: missing solution/solve.sh" in message


def test_duplicate_ids_and_missing_split_are_refused(broken_copy: Path) -> None:
    first = sorted((broken_copy / "dev").iterdir())[0]
    shutil.copytree(first, broken_copy / "official" / first.name)
    assert f"official/{first.name}: duplicate task id (also in dev/)" in _problems(broken_copy)

    shutil.rmtree(broken_copy / "official")
    validate_structure(load_benchmark(broken_copy))  # a generated split is drawn at registration
    toml = broken_copy / "benchmark.toml"
    toml.write_text(toml.read_text().replace('generator = "arithmetic"\ncount = 60\n', ""))
    assert "split 'official': directory official/ is missing" in _problems(broken_copy)

    toml.write_text(toml.read_text().replace("[splits.official]\nhidden = true\n", ""))
    assert "split 'official' is not declared in benchmark.toml" in _problems(broken_copy)


@pytest.mark.parametrize("lines, expected", [
    ('generator = "arithmetic"\ncount = 60\nseed = 7\n', "seed is the operator's, given at registration"),
    ('generator = "poetry"\ncount = 60\n', "generator must be one of arithmetic, shell"),
    ('generator = "arithmetic"\ncount = 0\n', "count must be a whole number of tasks from 1 to 1000"),
    ('generator = "arithmetic"\n', "count must be a whole number"),
    ("count = 60\n", "count needs a generator"),
])
def test_a_generated_split_is_declared_with_a_known_generator_and_no_seed(tmp_path: Path, lines: str,
                                                                           expected: str) -> None:
    root = tmp_path / "arithmetic"
    shutil.copytree(BENCHMARKS_DIR / "arithmetic", root)
    toml = root / "benchmark.toml"
    toml.write_text(toml.read_text().replace('generator = "arithmetic"\ncount = 60\n', lines))
    with pytest.raises(ValueError, match=re.escape(expected)):
        load_benchmark(root)


def test_qa_task_without_answer_file_is_refused(broken_copy: Path) -> None:
    task = sorted((broken_copy / "dev").iterdir())[0]
    config = task / "task.toml"
    config.write_text(config.read_text().replace('answer_file = "/app/answer.txt"\n', ""))
    assert f"dev/{task.name}: a \"qa\" task needs [metadata] answer_file" in _problems(broken_copy)


def test_a_task_that_declares_no_outputs_is_refused(broken_copy: Path) -> None:
    """The gym verifies in a fresh sandbox that gets only the declared artifacts: a task with
    none could never be solved, so it is refused at registration, not scored 0 forever."""
    task = sorted((broken_copy / "official").iterdir())[0]
    config = task / "task.toml"
    config.write_text(config.read_text().replace('artifacts = ["/app"]\n', ""))
    assert f"official/{task.name}: task.toml declares no artifacts" in _problems(broken_copy)


def test_not_a_benchmark_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a benchmark directory"):
        load_benchmark(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="benchmark.toml"):
        load_benchmark(tmp_path)
    (tmp_path / "benchmark.toml").write_text('name = "x"\n[splits.dev]\nhidden = "no"\n')
    with pytest.raises(ValueError, match=r"description must be a string.*hidden must be true or false"):
        load_benchmark(tmp_path)
