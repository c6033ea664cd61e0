"""What the two demos share (``ops/demo.py``, the walkthrough; ``ops/demo_agent.py``, a whole
track): the bundled benchmarks, shortened copies of them, a server process held for the demo's
length, and the operator's ``rsigym`` CLI run as a user runs it.

A demo owns its gym: it takes a free port (another gym on the one asked for, as the README's own
``rsigym up`` is on 8700, moves it elsewhere), counts its gym up only when the gym answers the admin
token in its own data dir (never a server that happened to answer on that port), and removes the data
dir it made when it ends, passed or failed (``--keep`` keeps it)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console

console = Console()
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
BUNDLED = ("arithmetic", "shell")


def pick_port(wanted: int, what: str = "the demo's gym") -> int:
    """``wanted`` if nothing listens on it (on loopback), else a free port, said aloud."""
    if _free(wanted):
        return wanted
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    console.print(f"port {wanted} is busy (another gym?): {what} takes port {port}")
    return port


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def demo_data_dir(data_dir: Path | None, prefix: str, keep: bool = False) -> Iterator[Path]:
    """The demo's data dir: ``data_dir`` (the operator's: kept), else a fresh one, removed when the
    demo ends, passed or failed, unless ``keep``."""
    made = data_dir is None
    data = Path(data_dir or tempfile.mkdtemp(prefix=prefix))
    data.mkdir(parents=True, exist_ok=True)
    try:
        yield data
    finally:
        if made and not keep:
            shutil.rmtree(data, ignore_errors=True)
            console.print(f"data dir {data} removed (--keep keeps it)")


def own_gym(url: str, data: Path) -> Callable[[], bool]:
    """Readiness of the gym the demo started with data dir ``data``: it answers an admin call with
    the token in that data dir. Another gym on the port refuses the token, so it is never taken for ours."""
    def ready() -> bool:
        try:
            token = (data / "admin-token").read_text().strip()
        except FileNotFoundError:
            return False  # written while the gym builds, before it serves
        r = httpx.get(f"{url}/admin/v1/keys", headers={"Authorization": f"Bearer {token}"}, timeout=2)
        return r.status_code == 200
    return ready


@contextmanager
def background_process(args: list[str], env: dict[str, str], ready_url: str, log: Path,
                       start_timeout: float = 90, ready: Callable[[], bool] | None = None,
                       ) -> Iterator[subprocess.Popen[bytes]]:
    """``args`` running until the block ends. It counts as started once ``ready()`` (default: an
    answer under 500 at ``ready_url``) while the process still runs: a server that exited (its port
    taken) is never mistaken for whatever else answers there."""
    def answers() -> bool:
        return httpx.get(ready_url, timeout=2).status_code < 500

    check = ready or answers
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_timeout  # the first start builds the base model
        while True:
            try:
                if check() and proc.poll() is None:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{' '.join(args[2:4])} did not start; the end of its log ({log}):\n{_tail(log)}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


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
