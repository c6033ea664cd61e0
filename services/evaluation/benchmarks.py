"""Offline benchmarks in Harbor's task format: load one and check its layout.

A benchmark is a directory, or a ``.tar.gz`` holding one (at the top or in a single folder)::

    benchmark.toml                 name, description, version, [splits.<split>] hidden = bool
                                   (a generated split also generator = "<name>", count = N),
                                   optionally [training] pool = "train.jsonl",
                                   optionally [judge] model = "<rollout model>", max_tokens = N
    <split>/<task-id>/             one Harbor task per folder, ids unique across splits:
        task.toml                  Harbor's TaskConfig; [metadata] kind ("qa" also answer_file)
        instruction.md
        environment/Dockerfile     (+ optional environment/app/: input files copied to /app)
        tests/test.sh              writes 0 or 1 to /logs/verifier/reward.txt
        solution/solve.sh
    train.jsonl                    optional training pool: {"question": …} per line

A **generated split** (``[splits.official] generator = "arithmetic"``, ``count = 60``) ships no
folder: the gym draws its tasks at registration from a seed its operator holds
(services/evaluation/official_splits.py), so no file of the benchmark's repository holds them. Until
then the split has no tasks; the registered copy has them in ``<split>/`` like any other split.

A **judged benchmark** (``[judge] model = "judge"``, Arena-Hard style) declares a model of the
gym's rollout catalogue (checked at registration) that its verifiers may ask. The verifier's
sandbox — never the agent's — gets a door to ``/rollout/v1`` with a key minted per job below the
operator's key (the judge is never paid by the run), and ``tests/test.sh`` sees
``RSIGYM_JUDGE_URL`` (an OpenAI-compatible base URL: ``$RSIGYM_JUDGE_URL/chat/completions``),
``RSIGYM_JUDGE_MODEL`` and, if declared, ``RSIGYM_JUDGE_MAX_TOKENS`` (the judge key refuses more).
The model and the prompts it was sent are recorded with each trial's result.

A **training pool** is the benchmark's train split, in the sense of GSM8K's: questions of the
benchmark's own form that no task of any split asks, published to agents (``GET
/evaluation/v1/benchmarks/{name}/training-pool``) so that they can build training data (answers from
a teacher, say) that the contamination audit will not flag. When a task space is small (the
arithmetic benchmark's has 4,005 questions) any data drawn from the space itself hits hidden tasks by
chance; a pool is the honest way out. Registration refuses a pool row that the audit's own scanner
matches to any task (services/evaluation/registry.py).

:func:`load_benchmark` reads leniently, so that :func:`validate_structure` can name every
problem at once. Nothing here runs a task; the oracle run belongs to the sandbox.
"""

from __future__ import annotations

import json
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.models.task.config import TaskConfig
from harbor.models.task.task import Task
from pydantic import ValidationError

from services.evaluation.task_generators import GENERATORS

REQUIRED_SPLITS = ("dev", "official")
REQUIRED_FILES = ("instruction.md", "tests/test.sh", "solution/solve.sh")
TARBALL_SUFFIXES = (".tar.gz", ".tgz")
POOL_MAX_ROWS = 200_000
POOL_MAX_BYTES = 32 * 1024 * 1024
POOL_MAX_QUESTION_CHARS = 20_000
GENERATED_MAX_TASKS = 1000


@dataclass(frozen=True, slots=True)
class TaskRef:
    id: str
    path: Path
    kind: str | None  # [metadata] kind, e.g. "qa" or "shell"
    answer_file: str | None  # [metadata] answer_file, for "qa" tasks
    config: TaskConfig | None  # None when Harbor refuses task.toml


@dataclass(frozen=True, slots=True)
class Generated:
    """A split drawn at registration (``[splits.<name>] generator``, ``count``)."""

    generator: str
    count: int


@dataclass(frozen=True, slots=True)
class Split:
    name: str
    hidden: bool
    tasks: list[TaskRef]
    generated: Generated | None = None


@dataclass(frozen=True, slots=True)
class Judge:
    """A judged benchmark's judge (``[judge]``): a rollout catalogue model its verifiers may ask."""

    model: str
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    description: str
    version: str
    root: Path
    splits: dict[str, Split]
    training_pool: str | None = None
    """The training pool's path relative to ``root`` (``[training] pool``), if it declares one."""
    judge: Judge | None = None
    """The judge its verifiers may ask (``[judge]``), if it declares one."""

    def tasks(self) -> Iterator[tuple[Split, TaskRef]]:
        for split in self.splits.values():
            for task in split.tasks:
                yield split, task


def load_benchmark(source: Path | str, *, extract_to: Path | None = None) -> Benchmark:
    """Read a benchmark from a directory or a ``.tar.gz``.

    A tarball is extracted into ``extract_to`` (default: a fresh temporary directory that
    the caller owns). Raises ``ValueError`` when there is no readable ``benchmark.toml``;
    problems inside tasks are left for :func:`validate_structure`.
    """
    source = Path(source)
    if source.is_dir():
        root = source
    elif source.is_file() and source.name.endswith(TARBALL_SUFFIXES):
        root = _extract(source, extract_to or Path(tempfile.mkdtemp(prefix="rsigym-benchmark-")))
    else:
        raise ValueError(f"{source}: not a benchmark directory or .tar.gz file")

    header = _read_header(root / "benchmark.toml")
    splits = {
        name: Split(name, hidden, [_task_ref(p) for p in _task_dirs(root / name)], generated)
        for name, (hidden, generated) in header["splits"].items()
    }
    return Benchmark(header["name"], header["description"], header["version"], root.resolve(), splits,
                     header["pool"], header["judge"])


def validate_structure(benchmark: Benchmark) -> None:
    """Raise one ``ValueError`` listing every structural problem, or return None."""
    problems = [
        f"split {name!r} is not declared in benchmark.toml"
        for name in REQUIRED_SPLITS
        if name not in benchmark.splits
    ]
    for split in benchmark.splits.values():
        if split.generated is not None and not (benchmark.root / split.name).exists():
            continue  # drawn at registration (services/evaluation/official_splits.py)
        if not (benchmark.root / split.name).is_dir():
            problems.append(f"split {split.name!r}: directory {split.name}/ is missing")
        elif not split.tasks:
            problems.append(f"split {split.name!r}: no tasks in {split.name}/")

    first_seen: dict[str, str] = {}
    for split, task in benchmark.tasks():
        if task.id in first_seen:
            problems.append(f"{split.name}/{task.id}: duplicate task id (also in {first_seen[task.id]}/)")
        first_seen.setdefault(task.id, split.name)
        problems.extend(f"{split.name}/{task.id}: {p}" for p in _task_problems(task.path))

    if benchmark.training_pool is not None:
        try:
            pool_questions(benchmark)
        except ValueError as err:
            problems.append(str(err))

    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ValueError(
            f"benchmark {benchmark.name!r} at {benchmark.root} has {len(problems)} problem(s):\n{listing}"
        )


def pool_questions(benchmark: Benchmark) -> list[str]:
    """The training pool's questions, in file order ([] without a pool); ``ValueError`` naming the
    first bad line when a line is not ``{"question": "<text>"}`` or the pool is too large."""
    if benchmark.training_pool is None:
        return []
    path = benchmark.root / benchmark.training_pool
    where = f"training pool {benchmark.training_pool}"
    try:
        if path.is_symlink() or not path.is_file():
            raise ValueError(f"{where}: not a regular file in the benchmark")
        if path.stat().st_size > POOL_MAX_BYTES:
            raise ValueError(f"{where}: larger than {POOL_MAX_BYTES} bytes")
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read: {exc}") from exc
    questions: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where} line {number}: not JSON ({exc.msg})") from exc
        question = row.get("question") if isinstance(row, dict) else None
        if not isinstance(question, str) or not question.strip() or len(question) > POOL_MAX_QUESTION_CHARS:
            raise ValueError(f"{where} line {number}: expected {{\"question\": \"<text>\"}} "
                             f"(a non-empty string of at most {POOL_MAX_QUESTION_CHARS} characters)")
        questions.append(question)
        if len(questions) > POOL_MAX_ROWS:
            raise ValueError(f"{where}: more than {POOL_MAX_ROWS} rows")
    if not questions:
        raise ValueError(f"{where}: no rows")
    return questions


# --------------------------------------------------------------------------- helpers


def _extract(tarball: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ValueError(f"{tarball}: cannot extract: {exc}") from exc
    if (dest / "benchmark.toml").is_file():
        return dest
    roots = [d for d in dest.iterdir() if d.is_dir() and (d / "benchmark.toml").is_file()]
    if len(roots) != 1:
        raise ValueError(f"{tarball}: expected one benchmark.toml at the top or in a single folder")
    return roots[0]


def _read_header(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read benchmark.toml: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from exc

    errors = [f"{key} must be a string" for key in ("name", "description", "version")
              if not isinstance(data.get(key), str)]
    splits: dict[str, tuple[bool, Generated | None]] = {}
    tables = data.get("splits")
    if not isinstance(tables, dict):
        errors.append("[splits.<name>] tables are missing")
    else:
        for name, table in tables.items():
            hidden = table.get("hidden") if isinstance(table, dict) else None
            if not isinstance(hidden, bool):
                errors.append(f"[splits.{name}] hidden must be true or false")
                continue
            generated, problems = _generated(name, table)
            errors.extend(problems)
            splits[name] = (hidden, generated)
    pool: str | None = None
    training = data.get("training", {})
    if not isinstance(training, dict):
        errors.append("[training] must be a table")
    elif "pool" in training:
        raw = training["pool"]
        parts = PurePosixPath(raw).parts if isinstance(raw, str) else ()
        if not parts or raw.startswith("/") or ".." in parts or "\\" in raw:
            errors.append("[training] pool must be a relative path inside the benchmark (no '..')")
        else:
            pool = PurePosixPath(raw).as_posix()
    judge, problems = _judge(data.get("judge"))
    errors.extend(problems)
    if errors:
        raise ValueError(f"{path}: " + "; ".join(errors))
    return {**data, "splits": splits, "pool": pool, "judge": judge}


JUDGE_MAX_TOKENS = 1_000_000


def _judge(table: Any) -> tuple[Judge | None, list[str]]:
    """``[judge] model = "<name>"``, optionally ``max_tokens = N``; whether the model is in the
    gym's rollout catalogue is the registry's to check (services/evaluation/registry.py)."""
    if table is None:
        return None, []
    if not isinstance(table, dict):
        return None, ["[judge] must be a table"]
    problems = [f"[judge] {k}: unknown key (model, max_tokens)" for k in table if k not in ("model", "max_tokens")]
    model, max_tokens = table.get("model"), table.get("max_tokens")
    if not isinstance(model, str) or not model.strip() or len(model) > 200:
        problems.append('[judge] model must name a model of the gym\'s rollout catalogue, e.g. model = "judge"')
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or not 1 <= max_tokens <= JUDGE_MAX_TOKENS):
        problems.append(f"[judge] max_tokens must be a whole number from 1 to {JUDGE_MAX_TOKENS}")
    if problems:
        return None, problems
    return Judge(str(model), max_tokens), []


def _generated(split: str, table: dict[str, Any]) -> tuple[Generated | None, list[str]]:
    """A split's ``generator`` and ``count``, if it declares a generator."""
    where = f"[splits.{split}]"
    if "seed" in table:  # a seed in the benchmark is a seed every reader of the repository has
        return None, [f"{where} seed: a generated split's seed is the operator's, given at registration "
                      "(--seed-file), never written in the benchmark"]
    if "generator" not in table:
        return None, [f"{where} count needs a generator"] if "count" in table else []
    name, count = table["generator"], table.get("count")
    problems = []
    if not isinstance(name, str) or name not in GENERATORS:
        problems.append(f"{where} generator must be one of {', '.join(sorted(GENERATORS))}")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= GENERATED_MAX_TASKS:
        problems.append(f"{where} count must be a whole number of tasks from 1 to {GENERATED_MAX_TASKS}")
    elif not problems:
        return Generated(name, count), []
    return None, problems


def _task_dirs(split_dir: Path) -> list[Path]:
    if not split_dir.is_dir():
        return []
    return sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def _parse_config(task_dir: Path) -> TaskConfig:
    """Harbor's own parse of task.toml; raises ``ValueError`` with a one-line reason."""
    try:
        return TaskConfig.model_validate_toml((task_dir / "task.toml").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ValueError("missing task.toml") from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"task.toml refused by harbor: {exc}") from exc
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'task.toml'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"task.toml refused by harbor: {reasons}") from exc


def _task_ref(task_dir: Path) -> TaskRef:
    try:
        config: TaskConfig | None = _parse_config(task_dir)
    except ValueError:
        config = None
    metadata = config.metadata if config else {}
    kind, answer_file = metadata.get("kind"), metadata.get("answer_file")
    return TaskRef(
        id=task_dir.name,
        path=task_dir.resolve(),
        kind=kind if isinstance(kind, str) else None,
        answer_file=answer_file if isinstance(answer_file, str) else None,
        config=config,
    )


def _task_problems(task_dir: Path) -> list[str]:
    problems = [f"missing {rel}" for rel in REQUIRED_FILES if not (task_dir / rel).is_file()]
    try:
        config = _parse_config(task_dir)
    except ValueError as exc:
        return [str(exc), *problems]

    kind = config.metadata.get("kind")
    if not isinstance(kind, str) or not kind:
        problems.append("task.toml [metadata] kind is missing")
    elif kind == "qa":
        answer_file = config.metadata.get("answer_file")
        if not isinstance(answer_file, str) or not answer_file.startswith("/"):
            problems.append('a "qa" task needs [metadata] answer_file, an absolute path')
    if not config.environment.docker_image and not (task_dir / "environment" / "Dockerfile").is_file():
        problems.append("missing environment/Dockerfile")
    if config.steps:
        problems.append("multi-step tasks ([[steps]]) are not supported by the gym's trials")
    if not config.artifacts:
        # The gym verifies in a fresh sandbox (services/evaluation/trials.py): only declared
        # outputs reach the verifier, so a task that declares none could never be solved.
        problems.append("task.toml declares no artifacts: the gym's verifier runs in a fresh sandbox and "
                        'sees only the declared outputs (e.g. artifacts = ["/app"])')

    if not problems:  # whatever else Harbor itself checks when it opens a task
        try:
            Task(task_dir)
        except (OSError, ValueError, RuntimeError) as exc:
            problems.append(f"harbor refuses the task: {exc}")
    return problems
