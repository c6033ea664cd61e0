"""Shared fixtures: real stores (SQLite file, PostgreSQL schema), the stand-in provider on
loopback, and embedded gyms built exactly as ``rsigym up`` builds them."""

from __future__ import annotations

import os
import shutil
import sqlite3

# torch's OpenMP threads busy-wait when the 2 cores are shared with the servers under test;
# one thread is many times faster here. Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import secrets
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from kit.config import GymConfig
from kit.settings import GymSettings, ProviderSecrets, StoreSettings, default_models_dir
from ops.builder import Gym, build_embedded
from services.rollout.standin import create_standin_app
from storage.store import Store, sqlite_url
from tests.fakes.pg_schemas import fresh_schema
from tests.fakes.servers import serve

PG_URL = os.environ.get("RSIGYM_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_bwrap() -> None:
    """Tests that run sandboxes or launched agents need bubblewrap: a CI host without it fails,
    a developer's machine without it skips."""
    if shutil.which("bwrap") is None:
        if IN_CI:
            pytest.fail("bubblewrap (bwrap) is missing on a CI host")
        pytest.skip("bubblewrap (bwrap) is not installed")


def require_redis(url: str) -> str:
    """``url`` once its Redis answers: a CI host without it fails, a developer's machine skips."""
    import redis

    try:
        redis.Redis.from_url(url, socket_timeout=3).ping()
    except (redis.RedisError, OSError):
        if IN_CI:
            pytest.fail(f"Redis is required in CI but {url} is unreachable")
        pytest.skip("Redis not reachable (set CI=true to make this a failure)")
    return url


TEACHER_ENV = "RSIGYM_TEST_TEACHER_KEY"
MODELS_DIR = Path(os.environ.get("RSIGYM_MODELS_DIR") or default_models_dir())
"""Built base models are shared with every gym of this machine (the build is keyed by its recipe)."""
ADMIN_TOKEN = "rsa-test-admin-token"


def _pg_reachable() -> bool:
    try:
        engine = create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_available() -> bool:
    ok = _pg_reachable()
    if not ok and IN_CI:
        pytest.fail(f"PostgreSQL is required in CI but {PG_URL} is unreachable")
    return ok


@pytest.fixture
def pg_schema(pg_available: bool) -> Iterator[str]:
    """A fresh, empty PostgreSQL schema for one test; dropped afterwards."""
    if not pg_available:
        pytest.skip("PostgreSQL not reachable (set CI=true to make this a failure)")
    with fresh_schema(PG_URL, "t_") as schema:
        yield schema


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store migrated once per session, which every fixture's SQLite store starts as a copy of.

    Migrating a fresh file is ~0.3 s of Alembic (every revision loaded and run) and a suite makes
    ~560 of these stores; a copy is ~10 ms. Each copy still gets ``Store.migrate()`` (a
    no-op at head), and the migrations themselves are tested on fresh files and schemas
    (tests/integration/storage/)."""
    s = Store(sqlite_url(tmp_path_factory.mktemp("sqlite-template")), StoreSettings())
    s.migrate()
    s.dispose()
    return Path(s.engine.url.database or "")


def migrated_sqlite(template: Path, data_dir: Path) -> Store:
    """A migrated SQLite store in ``data_dir`` (``sqlite_url(data_dir)``), copied from ``template``."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = data_dir / "gym.sqlite3"
    with closing(sqlite3.connect(template)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)  # a consistent copy, WAL mode included
    target.chmod(0o600)
    store = Store(sqlite_url(data_dir), StoreSettings())
    store.migrate()
    return store


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated store, once per backend."""
    if request.param == "sqlite":
        s = migrated_sqlite(request.getfixturevalue("sqlite_template"), tmp_path)
    else:
        schema = request.getfixturevalue("pg_schema")
        s = Store(PG_URL, StoreSettings(), schema=schema)
        s.migrate()
    yield s
    s.dispose()


@pytest.fixture
def pg_store(pg_schema: str) -> Iterator[Store]:
    """A migrated PostgreSQL store of the test's own (for what only a server shows: a
    transaction's locks, a connection the server drops)."""
    s = Store(PG_URL, StoreSettings(), schema=pg_schema)
    s.migrate()
    yield s
    s.dispose()


@pytest.fixture
def sqlite_store(tmp_path: Path, sqlite_template: Path) -> Iterator[Store]:
    """A migrated SQLite store of the test's own (for tests that hand it to an embedded gym and
    read it back; ``store`` runs on both backends)."""
    s = migrated_sqlite(sqlite_template, tmp_path / "db")
    yield s
    s.dispose()


@pytest.fixture(scope="session")
def teacher_secret() -> str:
    return "sk-teacher-" + secrets.token_hex(16)


@pytest.fixture(scope="session")
def standin(teacher_secret: str) -> Iterator[tuple[str, Any]]:
    """The stand-in provider on loopback: (base URL with /v1, its app)."""
    app = create_standin_app(teacher_secret)
    with serve(app) as url:
        yield url + "/v1", app


def tiny_instruct(config: GymConfig) -> GymConfig:
    """``config`` with the tiny model as the harness track's instruct model (SmolLM2 stays declared).

    The default config makes SmolLM2-135M-Instruct the instruct model where its wheel is installed
    (kit/config.py). The tests' gyms keep the tiny one: scoring a harness-track run also runs the
    initial system, the minimal harness on the instruct model, on every official task, and SmolLM2
    decodes ~10-40x slower on a CPU (docs/performance.md) — that doubled the tests that score such
    runs. The default itself is tested as it is (tests/unit/kit/test_default_models.py,
    tests/integration/services/models/)."""
    if config.base_model("tiny") is not None:
        config.tracks.instruct_model = "tiny"
    return config


def gym_config(api_base: str, **rollout: Any) -> GymConfig:
    """The tests' gym config: the default base models (instruct model: :func:`tiny_instruct`) and a
    rollout catalogue of the stand-in at ``api_base``."""
    return tiny_instruct(GymConfig.model_validate(
        {
            "rollout": {
                "models": [
                    {"name": "teacher", "litellm_model": "openai/teacher", "api_base": api_base,
                     "api_key_env": TEACHER_ENV, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0},
                    {"name": "judge", "litellm_model": "openai/judge", "api_base": api_base,
                     "api_key_env": TEACHER_ENV, "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0},
                ],
                **rollout,
            }
        }
    ))


@pytest.fixture
def make_gym(tmp_path: Path, standin: tuple[str, Any], teacher_secret: str,
             sqlite_template: Path) -> Iterator[Callable[..., Gym]]:
    """Build embedded gyms on a given store (default: SQLite in tmp_path)."""
    built: list[Gym] = []
    owned: list[Store] = []
    """The stores made here (a store passed in is its giver's to dispose of)."""

    def make(store: Store | None = None, config: GymConfig | None = None, secrets_: dict[str, str] | None = None) -> Gym:
        settings = GymSettings(data_dir=tmp_path / f"gym{len(built)}", admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR)
        if store is None:
            store = migrated_sqlite(sqlite_template, settings.data_dir)
            owned.append(store)
        gym = build_embedded(
            settings,
            config=config or gym_config(standin[0]),
            store=store,
            provider_secrets=ProviderSecrets(secrets_ if secrets_ is not None else {TEACHER_ENV: teacher_secret}),
            run_reaper=False,
        )
        built.append(gym)
        return gym

    yield make
    for gym in built:
        for service_app in gym.service_apps.values():
            runner = getattr(getattr(service_app.state, "training", None), "runner", None)
            if runner is not None:
                runner.wait_idle(timeout=60)
                runner.shutdown()
            close = getattr(service_app.state, "close", None)
            if close is not None:  # live sandboxes are killed, evaluation workers stopped
                close()
    for store in owned:  # its writer thread ended, its connections closed
        store.dispose()


@pytest.fixture
def gym(make_gym: Callable[..., Gym]) -> Gym:
    return make_gym()


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def create_key(client: httpx.Client, budget_usd: float = 1.0, track: str = "joint", **extra: Any) -> dict[str, Any]:
    response = client.post("/admin/v1/keys", json={"track": track, "budget_usd": budget_usd, **extra}, headers=admin_headers())
    assert response.status_code == 201, response.text
    return response.json()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def client_for(gym: Gym) -> Any:
    """A synchronous client on the real app, in-process (FastAPI's TestClient)."""
    from fastapi.testclient import TestClient

    return TestClient(gym.app, base_url="http://gym")
