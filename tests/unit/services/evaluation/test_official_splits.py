"""Generated official splits (services/evaluation/official_splits.py): drawn at registration from the
gym's seed or the operator's, recorded by fingerprint and digest, run like the dev tasks, and refused
where they would not be secret. Registry tests run on SQLite and PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from kit.errors import Unprocessable
from kit.settings import StoreSettings
from services.evaluation.official_splits import SEED_FILE, split_digest
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.task_generators import public_draw
from storage.store import Store, sqlite_url
from tests.fakes.live_gym import mini_benchmark

SEED = "f" * 16 + "an operator's seed, kept off the repository" + "0" * 16


def _official(registry: BenchmarkRegistry, name: str) -> dict[str, str]:
    """task id → instruction of the registered official split."""
    return {t.id: (t.path / "instruction.md").read_text() for t in registry.load(name).splits["official"].tasks}


def test_registration_draws_the_split_from_the_gyms_seed_and_records_it(store: Store, tmp_path: Path) -> None:
    registry = BenchmarkRegistry(store, tmp_path / "registry")
    row, bench = registry.register(mini_benchmark(tmp_path / "src", name="drawn", per_split=3, shared_verifier=True))
    official = bench.splits["official"]
    assert [t.id for t in official.tasks] == ["sub-0004", "sub-0005", "sub-0006"]  # after the dev ids
    generated = row.splits["official"]["generated"]
    assert generated["generator"] == "arithmetic" and generated["count"] == 3 and generated["seed"] == "gym"
    assert generated["sha256"] == split_digest(Path(row.path) / "official") and len(generated["seed_fingerprint"]) == 16
    seed = registry.root / SEED_FILE
    assert stat.S_IMODE(seed.stat().st_mode) == 0o600 and generated["seed_fingerprint"] not in seed.read_text()
    # Run like the dev tasks: their 60 s agent timeout and Harbor's default (shared) verifier mode.
    dev = bench.splits["dev"].tasks[0].config
    for task in official.tasks:
        assert task.config is not None and dev is not None
        assert task.config.agent.timeout_sec == 60.0 and "environment_mode" not in (task.path / "task.toml").read_text()
        assert (task.config.agent, task.config.verifier, task.config.environment) == (dev.agent, dev.verifier,
                                                                                      dev.environment)
    # Registering again (as after an upgrade) draws the very same tasks; the seed file is not remade.
    before, made = _official(registry, "drawn"), seed.read_bytes()
    again, _ = registry.register(mini_benchmark(tmp_path / "src2", name="drawn", per_split=3, shared_verifier=True),
                                 replace=True)
    assert _official(registry, "drawn") == before and again.splits["official"]["generated"] == generated
    assert seed.read_bytes() == made


def test_an_operator_seed_file_reproduces_the_split_on_another_gym(store: Store, tmp_path: Path) -> None:
    (tmp_path / "seed").write_text(SEED + "\n")
    source = mini_benchmark(tmp_path / "src", name="board", per_split=5)
    first = BenchmarkRegistry(store, tmp_path / "gym-a")
    row_a, _ = first.register(source, seed_file=tmp_path / "seed")
    # Another gym (its own store, its own directory) given the same seed file.
    other = Store(sqlite_url(tmp_path / "b"), StoreSettings())
    other.migrate()
    try:
        second = BenchmarkRegistry(other, tmp_path / "gym-b")
        row_b, _ = second.register(source, seed_file=tmp_path / "seed")
        assert row_a.splits["official"]["generated"] == row_b.splits["official"]["generated"]
        assert row_b.splits["official"]["generated"]["seed"] == "operator"
        assert _official(first, "board") == _official(second, "board")
        # The gym's own seed is a different one: a different split, told apart by its fingerprint.
        own, _ = second.register(source, replace=True)
        assert own.splits["official"]["generated"]["seed_fingerprint"] != row_a.splits["official"]["generated"][
            "seed_fingerprint"]
        assert own.splits["official"]["generated"]["sha256"] != row_a.splits["official"]["generated"]["sha256"]
        # ... and the gym's seed, given as a seed file to the first gym, reproduces that one.
        copied, _ = first.register(source, replace=True, seed_file=second.root / SEED_FILE)
        assert copied.splits["official"]["generated"]["sha256"] == own.splits["official"]["generated"]["sha256"]
    finally:
        other.dispose()


@pytest.mark.parametrize("content, expected", [
    ("42\n", "a seed is 32 to 4096 characters of secret"),
    (None, "cannot read"),
])
def test_a_guessable_or_missing_seed_file_is_refused(store: Store, tmp_path: Path, content: str | None,
                                                    expected: str) -> None:
    if content is not None:
        (tmp_path / "seed").write_text(content)
    registry = BenchmarkRegistry(store, tmp_path / "registry")
    with pytest.raises(Unprocessable, match=expected) as refused:
        registry.register(mini_benchmark(tmp_path / "src"), seed_file=tmp_path / "seed")
    assert refused.value.param == "seed_file" and registry.list() == []


def test_a_benchmark_that_ships_its_generated_split_is_refused(store: Store, tmp_path: Path) -> None:
    """Declared generated but committed anyway: the committed tasks are public, so nothing is registered."""
    bench = mini_benchmark(tmp_path / "src", name="shipped")
    shutil.copytree(bench / "dev" / "sub-0001", bench / "official" / "sub-0099")
    root = tmp_path / "registry"
    with pytest.raises(Unprocessable, match="must not ship their folder") as refused:
        BenchmarkRegistry(store, root).register(bench)
    assert refused.value.param == "path"
    assert sorted(p.name for p in root.iterdir() if p.name != SEED_FILE) == []


def test_never_a_question_the_repository_published_or_the_pool_holds(store: Store, tmp_path: Path) -> None:
    """A pool that leaves only three questions free: the draw takes those three and no other, and a
    fourth is an honest refusal, not a repeated or published question."""
    draw = public_draw("arithmetic")
    published = {s.instruction.strip() for s in (*draw.dev, *draw.retired)}
    free = [f"What is {a} - {b}?" for a in range(10, 100) for b in range(10, a)]
    free = [q for q in free if q not in published]
    bench = mini_benchmark(tmp_path / "src", name="crowded", per_split=3)
    (bench / "train.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in free[3:]))
    registry = BenchmarkRegistry(store, tmp_path / "registry")
    _, registered = registry.register(bench)
    assert sorted(_official(registry, "crowded").values()) == sorted(q + "\n" for q in free[:3])
    assert registered.splits["official"].tasks

    toml = bench / "benchmark.toml"
    toml.write_text(toml.read_text().replace("count = 3", "count = 4"))
    with pytest.raises(Unprocessable, match="found only 3 of 4 questions"):
        registry.register(bench, replace=True)
