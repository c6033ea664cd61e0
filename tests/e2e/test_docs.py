"""The docs are tested (issue 16, item 8): every fenced block of README.md and docs/*.md whose info
string says ``runnable`` is run, as written, against a gym started offline by the README's own
``rsigym up`` line.

* ```` ```bash runnable gym ```` — the gym's start line (README, exactly one): run as written
  from the repository root, with ``HOME`` a fresh directory (so ``~/.rsigym`` is this test's) and
  only its ``--port`` swapped for a free one.
* ```` ```bash runnable ```` and ```` ```python runnable ```` — run in order, each doc in a working
  directory of its own, with the environment an operator's shell or an agent's container has:
  ``RSIGYM_URL``, ``RSIGYM_API_KEY`` (a joint run key, $5), the venv's ``rsigym`` / ``gym`` /
  ``python`` first on ``PATH``. A bash block's exported variables carry to the doc's next blocks.

A block that exits non-zero fails the test with its doc, line and output.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import MODELS_DIR
from tests.fakes.servers import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.M | re.S)
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    role: str
    code: str

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def runnable_blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    found = []
    for m in FENCE.finditer(text):
        words = m.group(2).split()
        if words[:1] == ["runnable"]:
            found.append(Block(doc, text.count("\n", 0, m.start()) + 1, m.group(1), " ".join(words[1:]), m.group(3)))
    return found


ALL = [b for doc in DOCS for b in runnable_blocks(doc)]
DOCS_WITH_BLOCKS = sorted({b.doc for b in ALL if b.role == ""})
# ```bash runnable distributed```: the operator guide's bare-metal walkthrough, which starts a gym
# of its own (tests/e2e/test_docs_distributed.py runs those blocks).


def test_runnable_blocks_are_well_formed() -> None:
    assert {b.lang for b in ALL} <= {"bash", "python"}, [b.where() for b in ALL if b.lang not in ("bash", "python")]
    gyms = [b for b in ALL if b.role == "gym"]
    assert [b.doc.name for b in gyms] == ["README.md"], "the README has exactly one gym start line"
    assert {b.role for b in ALL} <= {"", "gym", "distributed"}
    line = gyms[0].code.strip()
    assert "\n" not in line and " up " in f"{line} " and "--config" not in line  # offline: no config to write
    assert len(DOCS_WITH_BLOCKS) >= 2


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The README's gym, up; the environment blocks run in."""
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    line = [b for b in ALL if b.role == "gym"][0].code.strip()
    line = re.sub(r"--port \d+", f"--port {port}", line)
    venv_bin = str(Path(sys.executable).parent)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RSIGYM_", "E2B_"))}
    env = {**base, "HOME": str(home), "RSIGYM_MODELS_DIR": str(MODELS_DIR), "COLUMNS": "200",
           "PATH": f"{venv_bin}:{base.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    url = f"http://127.0.0.1:{port}"
    log_path = home / "gym.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", "-c", line], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_healthy(proc, url, log_path, timeout_s=240)
        env["RSIGYM_URL"] = url
        created = subprocess.run(["rsigym", "keys", "create", "--track", "joint", "--budget", "5", "--name", "docs",
                                  "--json"], env=env, capture_output=True, text=True, timeout=120, cwd=home)
        assert created.returncode == 0, created.stderr
        env["RSIGYM_API_KEY"] = json.loads(created.stdout)["key"]
        yield env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in log_path.read_text(), log_path.read_text()[-3000:]


def _env_after(env_file: Path, before: dict[str, str]) -> dict[str, str]:
    if not env_file.exists():
        return before
    pairs = [item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item]
    return {k: v for k, v in pairs}


@pytest.mark.parametrize("doc", DOCS_WITH_BLOCKS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_runnable_block_runs(doc: Path, gym: dict[str, str], tmp_path: Path) -> None:
    env = dict(gym)
    for block in (b for b in runnable_blocks(doc) if b.role == ""):
        env_file = tmp_path / ".env-after"
        env_file.unlink(missing_ok=True)
        if block.lang == "bash":
            script = f"set -euo pipefail\n{block.code}\nenv -0 > {shlex.quote(str(env_file))}\n"
            argv = ["bash", "-c", script]
        else:
            argv = [sys.executable, "-c", block.code]
        done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        assert done.returncode == 0, (f"{block.where()} ({block.lang}) exited {done.returncode}\n--- block\n{block.code}"
                                      f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
        if block.lang == "bash":
            env = _env_after(env_file, env)
