"""What the two demos share (``ops/demo.py``, the walkthrough; ``ops/demo_agent.py``, a whole
track): the bundled benchmarks, shortened copies of them, a server process held for the demo's
length, and the operator's ``rsigym`` CLI run as a user runs it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console

console = Console()
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
BUNDLED = ("arithmetic", "shell")


@contextmanager
def background_process(args: list[str], env: dict[str, str], ready_url: str, log: Path,
             start_timeout: float = 90) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_timeout  # the first start builds the base model
        while True:
            try:
                if httpx.get(ready_url, timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{args[2:4]} did not start; see {log}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def rsigym_cli(*args: str, env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> str:
    done = subprocess.run([sys.executable, "-m", "ops.cli.main", *args], env={**env, "COLUMNS": "200"}, capture_output=True, text=True, check=False)
    if done.returncode not in ok_codes:
        raise SystemExit(f"rsigym {' '.join(args)} failed: {done.stderr or done.stdout}")
    return done.stdout


def trimmed_benchmarks(dest: Path, per_split: int, names: Sequence[str] = BUNDLED) -> list[Path]:
    """The bundled benchmarks cut to ``per_split`` tasks a split (same names): their first dev tasks,
    and a generated official split of ``per_split`` tasks (drawn by the gym at registration, as the full
    benchmark's is): what a shortened demo registers, validates, evaluates and scores. A training pool
    is kept whole (it is disjoint from every task of the full benchmark, so from the cut one too)."""
    roots = []
    for name in names:
        source, root = BENCHMARKS / name, dest / name
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        header = (source / "benchmark.toml").read_text()
        (root / "benchmark.toml").write_text(re.sub(r"(?m)^count = \d+$", f"count = {per_split}", header))
        if (source / "train.jsonl").is_file():
            shutil.copy2(source / "train.jsonl", root / "train.jsonl")
        for task in sorted((source / "dev").iterdir())[:per_split]:
            shutil.copytree(task, root / "dev" / task.name)
        roots.append(root)
    return roots
