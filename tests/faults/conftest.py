"""Fault injection: shared parts.

* :class:`FaultProxy` — a TCP forwarder in front of PostgreSQL that a test can cut, slow down
  (every forwarded piece waits ``delay_s``) or restore, and that knows the local ports of its
  upstream connections (so ``pg_terminate_backend`` hits this test's backends, never another
  test's on the shared server).
* :func:`assert_ledger_sound` — the invariants every scenario ends with.
* :class:`Procs` — gym parts (``rsigym serve …``, ``rsigym worker``) as real subprocesses a test
  can ``kill -9``.
* ``provider`` — a stand-in provider whose answers can be held (``delay_s``) and whose streamed
  tokens are paced, so a call can be caught between its reservation and its settlement.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from services.rollout.standin import create_standin_app
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry
from tests.fakes.provider_faults import ProviderFaults
from tests.fakes.servers import serve
from tests.fakes.tcp_proxy import TcpProxy

ROOT = Path(__file__).resolve().parents[2]

# -- a store connection that can be cut, slowed, or have its backends terminated ---------------


FaultProxy = TcpProxy
"""The store proxy the scenarios cut, slow and inspect (tests/fakes/tcp_proxy.py)."""


# -- the invariants -------------------------------------------------------------------------


def ledger_figures(store: Store, key_id: str) -> dict[str, Any]:
    """The run's ledger as the store has it: rows by status, what the rows charged, the key's counters."""
    with store.transaction() as s:
        subtree = [key_id, *s.scalars(select(ApiKey.id).where(ApiKey.parent_id == key_id)).all()]
        rows = s.execute(select(LedgerEntry.status, func.count(), func.coalesce(func.sum(LedgerEntry.actual_nusd), 0))
                         .where(LedgerEntry.key_id.in_(subtree)).group_by(LedgerEntry.status)).all()
        key = s.get(ApiKey, key_id)
        assert key is not None, key_id
        return {"rows": {status: n for status, n, _ in rows}, "charged_nusd": sum(int(c) for _, _, c in rows),
                "spent_nusd": key.spent_nusd, "reserved_nusd": key.reserved_nusd, "budget_nusd": key.budget_nusd}


def assert_ledger_sound(store: Store, key_id: str) -> dict[str, Any]:
    """No hold left, no row lost or charged twice (the rows sum to what the key spent), the
    balance never negative. Returns the figures for scenario-specific checks."""
    f = ledger_figures(store, key_id)
    assert f["rows"].get("reserved", 0) == 0, f"reservations left held: {f}"
    assert f["reserved_nusd"] == 0, f"the key still holds money: {f}"
    assert f["charged_nusd"] == f["spent_nusd"], f"the ledger rows do not sum to what the key spent: {f}"
    assert f["budget_nusd"] is None or f["spent_nusd"] <= f["budget_nusd"], f"balance below zero: {f}"
    return f


def until(what: str, check: Callable[[], Any], timeout: float, poll: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(poll)


def assert_error_shape(response: httpx.Response, status: int | tuple[int, ...], error_type: str | tuple[str, ...]) -> None:
    statuses = (status,) if isinstance(status, int) else status
    types = (error_type,) if isinstance(error_type, str) else error_type
    assert response.status_code in statuses, (response.status_code, response.text)
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] in types, body
    assert body["request_id"].startswith("req_") and response.headers["X-Request-Id"] == body["request_id"]


# -- gym parts as subprocesses ------------------------------------------------------------------


class Procs:
    """``python -m ops.cli.main ARGS`` subprocesses with one environment; logs in ``logs``."""

    def __init__(self, logs: Path, env: dict[str, str]):
        self.logs = logs
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def spawn(self, name: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """``prefix``: a command the gym part is exec'd through (it must exec, so ``kill9`` hits the part)."""
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it; closed with the test
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "ops.cli.main", *args], cwd=ROOT, env=self.env,
                                stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_healthy(self, name: str, url: str, timeout: float = 120) -> None:
        proc = self.procs[name]

        def up() -> bool:
            assert proc.poll() is None, f"{name} exited with {proc.returncode}: {self.log(name)}"
            try:
                return httpx.get(url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        until(f"{name} healthy", up, timeout, poll=0.3)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Procs]]:
    made: list[Procs] = []

    def make(env: dict[str, str]) -> Procs:
        made.append(Procs(tmp_path / f"logs{len(made)}", env))
        return made[-1]

    yield make
    for p in made:
        p.stop()


# -- a provider that can hold a call ------------------------------------------------------------


@pytest.fixture
def provider(teacher_secret: str) -> Iterator[tuple[str, ProviderFaults]]:
    """A stand-in provider on loopback (its own, so a test may hold its calls): (base URL with
    /v1, its fault wrapper). Streamed tokens come every 0.1 s; ``faults.delay_s`` holds a call
    before it answers; ``faults.received`` counts the chat calls that reached it."""
    faults = ProviderFaults(create_standin_app(teacher_secret, token_delay_s=0.1))
    with serve(faults) as url:
        yield url + "/v1", faults


def rollout_toml(api_base: str, teacher_env: str, extra: str = "") -> str:
    """A gym config with the stand-in as the ``teacher`` model (prices as in tests/conftest.py)."""
    return (f'[[rollout.models]]\nname = "teacher"\nlitellm_model = "openai/teacher"\napi_base = "{api_base}"\n'
            f'api_key_env = "{teacher_env}"\ninput_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n\n{extra}')


PASSAGE_CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 40}
"""A non-arithmetic prompt: the stand-in answers a long passage, one token per 0.1 s when streamed."""
