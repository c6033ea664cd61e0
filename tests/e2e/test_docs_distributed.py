"""The operator guide's bare-metal distributed walkthrough, run as written (issue 55, item 9).

Its fenced blocks tagged ```` ```bash runnable distributed ```` (tests/e2e/test_docs.py runs the
other ``runnable`` blocks against an embedded gym, and leaves these alone) are run in order, in
one shell environment — each block's exported variables carry to the next — against the test
PostgreSQL server and Redis: services, two gateway replicas behind HAProxy, a Celery worker, a
revocation seen across replicas, a ``kill -9`` of the worker mid-job, spend per model and key.

The blocks read their names and ports from variables with defaults (``GYM_DIR``, ``GYM_DB``,
``LB_PORT``, …); this test sets them: free ports, a database of its own (dropped afterwards), a
Redis database and a queue prefix of its own, ``HOME`` a fresh directory. Whatever happens, every
process the blocks started is stopped — by the PIDs they recorded, and by each block's process
group — and the database and queues are removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, make_url, text

from tests.conftest import IN_CI, MODELS_DIR, PG_URL, require_redis
from tests.e2e.test_docs import ROOT, Block, _env_after, runnable_blocks
from tests.fakes.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

GUIDE = ROOT / "docs" / "operator-guide.md"
BLOCKS = [b for b in runnable_blocks(GUIDE) if b.role == "distributed"]
REDIS_URL = os.environ.get("RSIGYM_TEST_REDIS_URL_DOCS", "redis://127.0.0.1:6379/11")
PORTS = ("LB_PORT", "GW1_PORT", "GW2_PORT", "ROLLOUT_PORT", "TRAINING_PORT", "INFERENCE_PORT")
TOOLS = ("haproxy", "curl", "createdb", "dropdb")
BLOCK_TIMEOUT_S = 300


def test_the_walkthrough_is_there() -> None:
    assert len(BLOCKS) >= 8 and all(b.lang == "bash" for b in BLOCKS)
    code = "\n".join(b.code for b in BLOCKS)
    for needed in ("haproxy", "kill -9", "/revoke", "rsigym worker", "_spend_usd_total", "dropdb"):
        assert needed in code, needed
    for variable in ("GYM_DIR", "GYM_DB", *PORTS):
        assert f"{variable}=${{{variable}:-" in code, f"{variable} must keep the operator's default and take the test's"


def _require_tools() -> None:
    path = f"{os.environ.get('PATH', '')}:/usr/sbin"  # as the walkthrough's first block extends it
    missing = [t for t in TOOLS if shutil.which(t, path=path) is None]
    if missing:
        if IN_CI:
            pytest.fail(f"missing on a CI host: {', '.join(missing)} (make install installs haproxy)")
        pytest.skip(f"not installed: {', '.join(missing)}")


@dataclass
class Shell:
    """The blocks' shell: its environment (carried from block to block) and the process group of
    every block run (their background processes share it)."""

    env: dict[str, str]
    groups: list[int] = field(default_factory=list)


@pytest.fixture
def shell(tmp_path: Path, pg_available: bool) -> Iterator[Shell]:
    """The shell the blocks start from; afterwards, nothing of theirs is left."""
    if not pg_available:
        pytest.skip("PostgreSQL not reachable (set CI=true to make this a failure)")
    _require_tools()
    redis_url = require_redis(REDIS_URL)
    pg = make_url(PG_URL)
    ports: set[int] = set()
    while len(ports) < len(PORTS):
        ports.add(free_port())
    home = tmp_path / "home"
    home.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RSIGYM_", "E2B_", "PG"))}
    env = {**base, "HOME": str(home), "PATH": f"{venv_bin}:{base.get('PATH', '')}", "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1", "COLUMNS": "200", "RSIGYM_MODELS_DIR": str(MODELS_DIR),
           "GYM_DIR": str(tmp_path / "cluster"), "GYM_DB": f"rsigym_docs_{secrets.token_hex(4)}",
           "PGHOST": pg.host or "127.0.0.1", "PGPORT": str(pg.port or 5432), "PGUSER": pg.username or "postgres",
           "RSIGYM_REDIS_URL": redis_url, "RSIGYM_WORKER_QUEUE_PREFIX": f"t{secrets.token_hex(4)}.",
           **{name: str(port) for name, port in zip(PORTS, sorted(ports), strict=True)}}
    sh = Shell(env)
    try:
        yield sh
    finally:
        _stop_everything(Path(env["GYM_DIR"]), sh.groups)
        _drop_database(env["GYM_DB"])
        _forget_queues(redis_url, sh.env["RSIGYM_WORKER_QUEUE_PREFIX"],
                       runs=[v for v in sh.env.values() if v.startswith("key_")])


def _stop_everything(gym_dir: Path, groups: list[int]) -> None:
    """SIGTERM to every recorded PID, SIGKILL to what is left of them and of every block's group."""
    pids = []
    for pid_file in sorted((gym_dir / "pids").glob("*.pid")):
        with contextlib.suppress(ValueError):
            pids.append(int(pid_file.read_text().strip()))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours is gone for every purpose here.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    return True


def _drop_database(name: str) -> None:
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _forget_queues(redis_url: str, prefix: str, runs: list[str]) -> None:
    """Leave Redis as found: this test's queues, bindings, the killed worker's unacked task and its
    runs' record-chain anchors."""
    r = redis.Redis.from_url(redis_url)
    for run in runs:
        for name in r.scan_iter(match=f"rsigym:record-anchor:*:{run}"):
            r.delete(name)
    for pattern in (f"{prefix}*", f"_kombu.binding.{prefix}*", f"_kombu.binding_permanent.{prefix}*"):
        for name in r.scan_iter(match=pattern):
            r.delete(name)
    for tag, raw in r.hgetall("unacked").items():
        if f'"routing_key": "{prefix}'.encode() in raw:
            r.hdel("unacked", tag)
            r.zrem("unacked_index", tag)


def _logs(gym_dir: Path) -> str:
    parts = []
    for log in sorted((gym_dir / "logs").glob("*.log")):
        parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}")
    return "\n".join(parts)


def _run(block: Block, sh: Shell, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run one block as the docs test does (``set -euo pipefail``, exports carried), in a process
    group of its own; its background processes write to their logs, not to its pipes."""
    env_file = cwd / ".env-after"
    env_file.unlink(missing_ok=True)
    script = f"set -euo pipefail\n{block.code}\nenv -0 > {shlex.quote(str(env_file))}\n"
    proc = subprocess.Popen(["bash", "-c", script], env=sh.env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    sh.groups.append(proc.pid)
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    if proc.returncode == 0:
        sh.env = _env_after(env_file, sh.env)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_distributed_walkthrough_runs_as_written(shell: Shell, tmp_path: Path) -> None:
    gym_dir = Path(shell.env["GYM_DIR"])
    work = tmp_path / "work"
    work.mkdir()
    outputs = []
    for block in BLOCKS:
        started = time.monotonic()
        done = _run(block, shell, work)
        assert done.returncode == 0, (f"{block.where()} exited {done.returncode}\n--- block\n{block.code}"
                                      f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}\n"
                                      f"{_logs(gym_dir)}")
        outputs.append(f"{block.where()} ({time.monotonic() - started:.1f} s)\n{done.stdout}")
    text_out = "\n".join(outputs)
    # What the walkthrough says it shows, it showed.
    assert "x-rsigym-replica: gw1" in text_out.lower() and "x-rsigym-replica: gw2" in text_out.lower(), text_out
    assert "replica 2 refused the revoked key" in text_out and "40 training steps billed" in text_out, text_out
    assert "job succeeded at step 40 on worker 2" in text_out, text_out
    assert not list((gym_dir / "pids").glob("*.pid")), "the last block stops every process it recorded"
    for log in (gym_dir / "logs").glob("gateway-*.log"):
        assert "Traceback" not in log.read_text(errors="replace"), _logs(gym_dir)
