"""`make demo` runs `rsigym demo`: it must pass on a fresh data dir and leave no process behind.

The suite runs each demo shortened (``--tasks-per-split N``): every step of the real one, on the
arithmetic benchmark cut to its first N tasks per split (its training pool kept whole).

``make demo AGENT=dag`` runs the same steps (ops/demo_agent.py: the gym, the benchmarks, ``rsigym
run start``, watch, audit, score, report) with the DAG agent: the suite runs them in the recursive
loop's third generation (tests/e2e/test_generations_loop.py, the DAG agent launched and its run
audited, scored and reported with a positive index), not a fourth time here; the DAG agent's own
research graph is tested in tests/e2e/test_dag_agent.py, its demo arguments in
tests/unit/ops/test_demo_generations_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ops.demo import run_demo
from ops.demo_agent import run_agent_demo
from tests.fakes.servers import free_port


def _children() -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(os.getpid())], capture_output=True, text=True, check=False)
    return {int(p) for p in out.stdout.split()}


def test_the_demo_runs_a_joint_track_of_the_baseline_agent_and_cleans_up(tmp_path: Path) -> None:
    """`make demo`, shortened: a Joint run of the scripted baseline agent launched, watched, audited
    (accepted: its teacher data is the training pool's), scored avg@3 and reported with a positive
    RSI-Index (run_agent_demo's pass rule)."""
    before = _children()
    assert run_agent_demo("baseline", data_dir=tmp_path / "baseline", port=free_port(), tasks_per_split=4) == 0
    audit = json.loads(next((tmp_path / "baseline" / "audit").glob("*.json")).read_text())
    assert audit["status"] == "accepted", audit
    leftover = {pid for pid in _children() - before if Path(f"/proc/{pid}").exists()}
    assert not leftover


def test_the_walkthrough_runs_end_to_end_and_cleans_up(tmp_path: Path) -> None:
    """`make demo WALKTHROUGH=1`: one scripted client through every service."""
    before = _children()
    assert run_demo(data_dir=tmp_path / "demo", port=free_port(), tasks_per_split=4) == 0
    assert (tmp_path / "demo" / "admin-token").stat().st_mode & 0o077 == 0
    leftover = {pid for pid in _children() - before if Path(f"/proc/{pid}").exists()}
    assert not leftover
