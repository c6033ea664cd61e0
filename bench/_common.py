"""Helpers shared by the benchmarks (not tests): loopback servers, percentiles."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes.servers import free_port, serve  # noqa: E402


@contextlib.contextmanager
def standin_process(api_key: str) -> Iterator[str]:
    """The stand-in provider in its own process (so it does not share the bench's GIL)."""
    port = free_port()
    env = {**os.environ, "BENCH_STANDIN_KEY": api_key}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "standin", "--port", str(port), "--api-key-env", "BENCH_STANDIN_KEY"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/v1/models", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("stand-in provider did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    return f"p50 {pct(values, 50) * 1000:7.2f} ms  p99 {pct(values, 99) * 1000:7.2f} ms  mean {statistics.mean(values) * 1000:7.2f} ms"


__all__ = ["ROOT", "pct", "serve", "standin_process", "summary"]
