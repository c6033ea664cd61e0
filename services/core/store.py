"""The SQL store: SQLite file by default, PostgreSQL by URL, same code.

Every store call made while serving a request goes through :meth:`Store.call` (thread pool,
errors mapped) so an unreachable store turns into a 503 ``store_unavailable`` — the gym
fails closed, it never lets a call through unmetered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, event, exc, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from services.core.errors import StoreUnavailable
from services.core.fanout import KeyEvents
from services.core.settings import StoreSettings

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
MIGRATION_LOCK_ID = 0x5253_4947_796D  # "RSIGym": the advisory lock every replica migrates under

UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    exc.OperationalError,
    exc.InterfaceError,
    exc.TimeoutError,
)


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{Path(data_dir) / 'gym.sqlite3'}"


def _make_engine(url: str, settings: StoreSettings, schema: str | None) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": settings.sqlite_busy_timeout_ms / 1000},
            pool_size=settings.pool_size,
            max_overflow=settings.max_overflow,
            pool_timeout=settings.pool_timeout_s,
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control from pysqlite so we can BEGIN IMMEDIATE: a write
            # transaction that starts as a reader can deadlock on lock upgrade, and the
            # busy timeout does not resolve that case.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: never corrupts; a power cut may lose the last commits, not reorder them.
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={settings.sqlite_busy_timeout_ms}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine

    connect_args: dict[str, Any] = {"connect_timeout": settings.connect_timeout_s}
    # The URL's own ``?options=…`` (a search_path, say) is kept: connect_args would replace it.
    given = make_url(url).query.get("options", ())
    options = [f"-cstatement_timeout={settings.statement_timeout_ms}", *([given] if isinstance(given, str) else given)]
    if schema:
        options.append(f"-csearch_path={schema}")
    connect_args["options"] = " ".join(options)
    return create_engine(
        url,
        connect_args=connect_args,
        pool_size=settings.pool_size,
        max_overflow=settings.max_overflow,
        pool_timeout=settings.pool_timeout_s,
        pool_pre_ping=True,
    )


class Store:
    """Owns the engine and the session factory; knows how to migrate itself."""

    def __init__(
        self,
        url: str,
        settings: StoreSettings | None = None,
        *,
        schema: str | None = None,
        key_events: KeyEvents | None = None,
    ):
        self.url = url
        self.settings = settings or StoreSettings()
        self.schema = schema
        self.key_events = key_events or KeyEvents()
        """Where changes to keys stored here are announced (processes cache what keys may do)."""
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.engine = _make_engine(url, self.settings, schema)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._limiter = anyio.CapacityLimiter(self.settings.pool_size + self.settings.max_overflow)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """One unit of work: committed on success, rolled back on any error."""
        with self.guard(), self._sessions() as session, session.begin():
            yield session

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except UNAVAILABLE_ERRORS as err:
            raise StoreUnavailable("the gym's store cannot be reached; the call was refused") from err
        except exc.DBAPIError as err:
            if err.connection_invalidated:
                raise StoreUnavailable("the gym's store connection was lost; the call was refused") from err
            raise

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking store work off the event loop."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision, once however many replicas start
        together: on PostgreSQL under a transaction-level advisory lock (the others wait, then
        find nothing left to do); SQLite's BEGIN IMMEDIATE already serialises writers."""
        with self.guard(), self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SET LOCAL statement_timeout = 0"))  # waiting for another replica's migration is fine
                conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def dispose(self) -> None:
        self.engine.dispose()
        self.key_events.close()


def alembic_config() -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg
