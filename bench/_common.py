"""Helpers shared by the benchmarks (not tests): loopback servers, percentiles."""

from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes.pg_schemas import fresh_schema  # noqa: E402
from tests.fakes.servers import free_port, serve  # noqa: E402

if TYPE_CHECKING:
    from kit.settings import GymSettings
    from ops.builder import Gym
    from storage.store import Store


@contextlib.contextmanager
def standin_process(api_key: str) -> Iterator[str]:
    """The stand-in provider in its own process (so it does not share the bench's GIL)."""
    with server_process(lambda port: [sys.executable, "-m", "ops.cli.main", "standin", "--port", str(port),
                                      "--api-key-env", "BENCH_STANDIN_KEY"],
                        {"BENCH_STANDIN_KEY": api_key}, "/v1/models", "stand-in provider") as url:
        yield url


@contextlib.contextmanager
def server_process(argv: Callable[[int], list[str]], env: dict[str, str], probe: str, what: str) -> Iterator[str]:
    """``argv(port)`` run from the repository root with ``env`` added to this environment, until
    any answer to ``GET {url}{probe}``; stopped by its PID when the block ends."""
    port = free_port()
    proc = subprocess.Popen(argv(port), cwd=ROOT, env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + probe, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{what} did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def bench_dir(prefix: str = "rsigym-bench-") -> Iterator[Path]:
    """A data directory for one bench run, removed when the block ends (close the gym or store
    on it inside the block)."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as data:
        yield Path(data)


TEACHER_KEY_ENV = "BENCH_TEACHER_KEY"
"""The env name the gym's (and the LiteLLM proxy's) "teacher" model reads the stand-in's key from."""
BENCH_ADMIN_TOKEN = "bench-admin"


@dataclass
class BenchGym:
    """An embedded gym served on loopback whose one rollout model, ``teacher``, is the stand-in."""

    gym: Gym
    settings: GymSettings
    url: str
    key: str
    """A run key allowed the rollout service, with budget to spare."""


@contextlib.contextmanager
def embedded_gym(provider_url: str, provider_key: str, store: Store | None = None) -> Iterator[BenchGym]:
    """Build the embedded gym (in this process, SQLite under a temporary data dir unless ``store``
    is given) with ``teacher`` routed to the stand-in at ``provider_url``, serve it, make a run key."""
    from kit.config import GymConfig
    from kit.settings import GymSettings, ProviderSecrets
    from ops.builder import build_embedded

    config = GymConfig.model_validate({"rollout": {"models": [{
        "name": "teacher", "litellm_model": "openai/teacher", "api_base": provider_url + "/v1",
        "api_key_env": TEACHER_KEY_ENV, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}]}})
    with bench_dir() as data:
        settings = GymSettings(data_dir=data, admin_token=BENCH_ADMIN_TOKEN, internal_secret=secrets.token_hex(16))
        gym = build_embedded(settings, config=config, store=store,
                             provider_secrets=ProviderSecrets({TEACHER_KEY_ENV: provider_key}), run_reaper=False)
        with serve(gym.app) as url:
            r = httpx.post(f"{url}/admin/v1/keys", json={"policy": {"services": {"rollout": {}}}, "budget_usd": 1000},
                           headers={"Authorization": f"Bearer {BENCH_ADMIN_TOKEN}"}, timeout=60)
            r.raise_for_status()
            yield BenchGym(gym=gym, settings=settings, url=url, key=r.json()["key"])


@dataclass
class BenchGymProcess:
    """``rsigym up``'s server in a process of its own (tests/fakes/gym_process.py), as an operator
    runs it: the bench's client (an agent's SDK, say) does not share its GIL, as no agent does."""

    url: str
    key: str
    """A run key made with the bench's ``key_request``, with budget to spare."""
    pid: int


def teacher_config(provider_url: str) -> str:
    """A gym config whose one rollout model, ``teacher``, is the stand-in at ``provider_url``
    (its key in ``TEACHER_KEY_ENV``)."""
    return ("[[rollout.models]]\nname = \"teacher\"\nlitellm_model = \"openai/teacher\"\n"
            f"api_base = \"{provider_url}/v1\"\napi_key_env = \"{TEACHER_KEY_ENV}\"\n"
            "input_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n")


@contextlib.contextmanager
def gym_process(config_toml: str, env: dict[str, str] | None = None,
                key_request: dict[str, object] | None = None) -> Iterator[BenchGymProcess]:
    """Start the gym on ``config_toml`` (``env`` added to its environment) and make a run key
    (``POST /admin/v1/keys`` with ``key_request``; default: the rollout service only, $1,000)."""
    from tests.fakes.gym_process import ADMIN_TOKEN
    from tests.fakes.gym_process import gym_process as start

    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})  # the child inherits it; put back below
    try:
        with tempfile.TemporaryDirectory(prefix="rsigym-bench-", ignore_cleanup_errors=True) as data, \
                start(Path(data), config_toml) as gym:  # the process stops before its data dir goes
            r = httpx.post(f"{gym.url}/admin/v1/keys",
                           json=key_request or {"policy": {"services": {"rollout": {}}}, "budget_usd": 1000},
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
            r.raise_for_status()
            yield BenchGymProcess(url=gym.url, key=r.json()["key"], pid=gym.pid)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextlib.contextmanager
def fresh_pg_schema(url: str = PG_URL) -> Iterator[str]:
    """A new, empty PostgreSQL schema for one bench run; dropped afterwards, whatever happens."""
    with fresh_schema(url, "bench_") as schema:
        yield schema


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    return f"p50 {pct(values, 50) * 1000:7.2f} ms  p99 {pct(values, 99) * 1000:7.2f} ms  mean {statistics.mean(values) * 1000:7.2f} ms"


__all__ = ["BENCH_ADMIN_TOKEN", "PG_URL", "ROOT", "TEACHER_KEY_ENV", "BenchGym", "BenchGymProcess", "bench_dir", "embedded_gym",
           "free_port", "fresh_pg_schema", "gym_process", "pct", "serve", "server_process", "standin_process", "summary", "teacher_config"]
