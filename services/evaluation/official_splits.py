"""Generated splits: a benchmark's hidden tasks, drawn at registration from a seed the operator holds.

A benchmark whose ``benchmark.toml`` declares ``[splits.official] generator = "arithmetic"`` and
``count = 60`` ships no ``official/`` folder. Its repository keeps the generator (so its distribution
is public), the dev split and the training pool; the official tasks exist only in the gym's registered
copy under its data dir (0700), written by :func:`generate_splits` while the registry stages the
benchmark, then validated by oracle like any other split.

**The seed.** Per benchmark and split, ``HMAC-SHA256(seed, "rsigym official split" ‖ benchmark ‖
split)`` seeds the draw. The seed is the gym's own (:func:`gym_seed`: 32 random bytes made on first
use, kept in the registry's directory, never shown) or one the operator gives at registration
(:func:`operator_seed`, ``rsigym benchmarks register DIR --seed-file F``). So one gym registering a
benchmark again draws the same tasks (its scores stay comparable), two gyms draw different ones, and
two gyms given the same seed file draw the same ones: that is how a leaderboard is reproduced across
gyms. The registered row shows the seed's fingerprint (an HMAC of it, not the seed) and a digest of
the drawn split, so an operator can compare two gyms without exchanging tasks.

**What is never drawn**: every question the generator's public draw ever made (the dev split, the
retired official split of 1.0.0 that git history keeps, the published pool;
services/evaluation/task_generators), and every question of the benchmark's other splits and pool,
compared in the contamination audit's normalisation with their input files. After the draw,
:func:`check_generated_disjoint` checks the written split against the other splits again, and the
registry scans the pool against every task with the contamination scanner, as for any benchmark.

**Run settings** (``artifacts``, ``[agent]``, ``[verifier]``, ``[environment]``) are taken from the
benchmark's first dev task, so a re-tuned or cut-down benchmark runs its drawn tasks exactly as its
dev tasks; the generator decides only what a task asks and how it is checked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import re
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.private_files import EXEC_MODE, write_private
from services.evaluation.benchmarks import Benchmark, Generated, Split, TaskRef, load_benchmark, pool_questions
from services.evaluation.task_generators import TaskSpec, generator, public_draw, render_task
from services.evaluation.task_generators.rendering import question_key

SEED_FILE = ".official_seed"
"""The gym's own seed, in the registry's directory (no registered copy is named without a '-')."""
MIN_SEED_CHARS = 32
MAX_SEED_BYTES = 4096
RUN_SETTINGS = ("artifacts", "agent", "verifier", "environment")
_SPLIT_CONTEXT = b"rsigym official split\0"
_FINGERPRINT_CONTEXT = b"rsigym seed fingerprint"


@dataclass(frozen=True)
class Seed:
    material: bytes
    source: str
    """``gym`` (the gym's own) or ``operator`` (a --seed-file)."""

    def for_split(self, benchmark: str, split: str) -> str:
        message = _SPLIT_CONTEXT + benchmark.encode() + b"\0" + split.encode()
        return hmac.new(self.material, message, hashlib.sha256).hexdigest()

    def fingerprint(self) -> str:
        """Names the seed without giving it away: equal on two gyms exactly when their seeds are."""
        return hmac.new(self.material, _FINGERPRINT_CONTEXT, hashlib.sha256).hexdigest()[:16]


def gym_seed(root: Path) -> Seed:
    """The gym's own seed: ``root/.official_seed`` (0600), made once, atomically, on first use."""
    path = root / SEED_FILE
    if not path.exists():
        staged = root / f"{SEED_FILE}.{secrets.token_hex(8)}"
        write_private(staged, secrets.token_hex(32) + "\n")
        try:
            os.link(staged, path)  # only one of two racing registrations makes it
        except FileExistsError:
            pass
        finally:
            staged.unlink()
    material = path.read_bytes().strip()
    if len(material) < MIN_SEED_CHARS:
        raise RuntimeError(f"{path} is damaged (shorter than {MIN_SEED_CHARS} characters); restore it from a backup")
    return Seed(material, "gym")


def operator_seed(path: str | Path) -> Seed:
    """A seed the operator keeps in a file on the gym's host; ``ValueError`` if it is unreadable or
    too short to be secret (the generator is public: a guessable seed gives the split away)."""
    where = f"seed file {path}"
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SEED_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    material = data.strip()
    if len(data) > MAX_SEED_BYTES or len(material) < MIN_SEED_CHARS:
        raise ValueError(f"{where}: a seed is {MIN_SEED_CHARS} to {MAX_SEED_BYTES} characters of secret "
                         "(e.g. `openssl rand -hex 32 > seed`); a short one can be guessed")
    return Seed(material, "operator")


def generate_splits(root: Path, seed: Seed) -> dict[str, dict[str, Any]]:
    """Draw every generated split of the benchmark staged at ``root`` into ``root/<split>/``; returns
    what the registry records per split. ``ValueError`` if a generated split ships a folder."""
    bench = load_benchmark(root)
    generated = [(split, split.generated) for split in bench.splits.values() if split.generated is not None]
    shipped = [split.name for split, _ in generated if (root / split.name).exists()]
    if shipped:
        raise ValueError(f"split(s) {', '.join(shipped)} are generated at registration ([splits.<name>] generator): "
                         "the benchmark must not ship their folder (delete it; its tasks would be public)")
    settings = _run_settings(bench)
    taken = {task.id for _, task in bench.tasks()}
    info: dict[str, dict[str, Any]] = {}
    for split, declared in generated:
        specs = _draw(bench, split, declared, seed)
        prefix = generator(declared.generator).id_prefix
        number = 0
        for spec in specs:
            number += 1
            while f"{prefix}-{number:04d}" in taken:
                number += 1
            task_id = f"{prefix}-{number:04d}"
            taken.add(task_id)
            _write_task(root / split.name / task_id, bench.name, task_id, spec, settings)
        info[split.name] = {"generator": declared.generator, "count": len(specs),
                            "seed": seed.source, "seed_fingerprint": seed.fingerprint(),
                            "sha256": split_digest(root / split.name)}
    return info


def check_generated_disjoint(bench: Benchmark) -> None:
    """``ValueError`` naming a task of a generated split that asks a question another task asks."""
    seen: dict[str, str] = {}
    for split in sorted(bench.splits.values(), key=lambda s: s.generated is not None):  # given splits first
        for task in split.tasks:
            key = task_question_key(task)
            if key in seen and split.generated is not None:
                raise ValueError(f"generated task {split.name}/{task.id} asks the question of {seen[key]}")
            seen.setdefault(key, f"{split.name}/{task.id}")


def split_digest(split_dir: Path) -> str:
    """sha256 over a split's files (relative path and bytes, in path order)."""
    h = hashlib.sha256()
    for path in sorted(p for p in split_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        h.update(path.relative_to(split_dir).as_posix().encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def task_question_key(task: TaskRef) -> str:
    """A task's question on disk (instruction plus input files), as the generators key theirs."""
    app = task.path / "environment" / "app"
    inputs = ({p.relative_to(app).as_posix(): p.read_bytes() for p in app.rglob("*") if p.is_file()}
              if app.is_dir() else {})
    instruction = task.path / "instruction.md"
    return question_key(instruction.read_text(encoding="utf-8", errors="replace") if instruction.is_file() else "",
                        inputs)


# --------------------------------------------------------------------------- helpers


def _draw(bench: Benchmark, split: Split, declared: Generated, seed: Seed) -> list[TaskSpec]:
    gen = generator(declared.generator)
    excluded = public_draw(gen.name).question_keys()
    excluded |= {task_question_key(task) for other in bench.splits.values() if other.generated is None
                 for task in other.tasks}
    excluded |= {question_key(question, {}) for question in pool_questions(bench)}
    rng = random.Random(seed.for_split(bench.name, split.name))
    count, tries = declared.count, 0
    specs: list[TaskSpec] = []
    while len(specs) < count:
        tries += 1
        if tries > 50 * count + 50_000:  # ample for a space nearly used up (arithmetic: ~4,005 tries a question)
            raise ValueError(f"[splits.{split.name}]: generator {gen.name!r} found only {len(specs)} of {count} "
                             "questions that no public task, other split or training pool asks; ask for fewer")
        spec = gen.draw(rng, len(specs))
        key = spec.question_key()
        if key not in excluded:
            excluded.add(key)
            specs.append(spec)
    return specs


def _run_settings(bench: Benchmark) -> dict[str, Any]:
    """``artifacts`` and the ``[agent]``, ``[verifier]``, ``[environment]`` tables of the first task of
    the first given split (dev), as written there ({} when there is none)."""
    for split in bench.splits.values():
        if split.generated is None and split.tasks:
            raw = tomllib.loads((split.tasks[0].path / "task.toml").read_text(encoding="utf-8"))
            return {key: raw[key] for key in RUN_SETTINGS if key in raw}
    return {}


def _write_task(folder: Path, benchmark: str, task_id: str, spec: TaskSpec, settings: dict[str, Any]) -> None:
    files = render_task(benchmark, task_id, spec)
    drawn = tomllib.loads(files["task.toml"])
    if settings and {key: drawn[key] for key in RUN_SETTINGS if key in drawn} != settings:
        config = {**{key: value for key, value in drawn.items() if key not in RUN_SETTINGS}, **settings}
        files["task.toml"] = _toml(config)
        if tomllib.loads(files["task.toml"]) != config:
            raise ValueError(f"cannot copy the dev task's run settings into {task_id}'s task.toml")
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, text)
        if path.suffix == ".sh":
            path.chmod(EXEC_MODE)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml(data: dict[str, Any], table: str = "") -> str:
    """TOML for plain data (what ``tomllib`` reads from a task.toml), tables after the keys."""
    keys = "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in data.items() if not isinstance(v, dict))
    text = (f"[{table}]\n" if table else "") + keys
    for k, v in data.items():
        if isinstance(v, dict):
            text += "\n" + _toml(v, f"{table}.{_toml_key(k)}" if table else _toml_key(k))
    return text


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's escapes are TOML's basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} values in a task.toml")
