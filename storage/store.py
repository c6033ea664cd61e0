"""The SQL store: SQLite file by default, PostgreSQL by URL, same code.

Store work done while serving a request never blocks the event loop: it runs on a worker thread
(:meth:`Store.call`), or through the group commit (:meth:`Store.batched_async`: the store's writer
thread, or, for a lone call on SQLite, the loop itself when that needs no wait). Either way an
unreachable store turns into a 503 ``store_unavailable``: the gym fails closed, it never lets a
call through unmetered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import anyio
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import ClauseElement, Dialect, Engine, Select, UpdateBase, create_engine, event, exc, make_url, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import PoolProxiedConnection, QueuePool
from sqlalchemy.sql.compiler import SQLCompiler

from access.fanout import KeyEvents
from kit.errors import KeptConnectionLost, StoreUnavailable, WouldWait
from kit.private_files import FILE_MODE, open_private, private_dir
from kit.settings import StoreSettings
from storage.group_commit import GroupCommit
from storage.sqlite_checkpoints import BACKSTOP_PAGES, Checkpointer

T = TypeVar("T")
log = logging.getLogger("rsigym.store")



class AnchoredHead(Protocol):
    """A record chain's head as an anchor outside the store holds it."""

    @property
    def seq(self) -> int: ...

    def matches(self, event_hash: str) -> bool:
        """Whether ``event_hash`` is the hash of the event anchored at :attr:`seq`."""
        ...


class ChainAnchor(Protocol):
    """What a store's :attr:`Store.record_anchor` slot holds: where the heads of the record chains
    stored here are anchored outside the store. The store only keeps it for the records, which
    implement and use it (services/records/record_anchor.py, services/records/events.py)."""

    @property
    def where(self) -> str: ...

    def note(self, run_id: str, seq: int, hash_: str) -> None: ...

    def flush(self, timeout_s: float = ...) -> bool: ...

    def read(self, run_id: str) -> Sequence[AnchoredHead]: ...


SQLITE_DEFAULT_CACHE = -2000
"""SQLite's default ``cache_size`` (2,000 KiB), which a connection is given back with."""
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
MIGRATION_LOCK_ID = 0x5253_4947_796D  # "RSIGym": the advisory lock every replica migrates under

UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    exc.OperationalError,
    exc.InterfaceError,
    exc.TimeoutError,
)
_GUARDED: tuple[type[BaseException], ...] = (*UNAVAILABLE_ERRORS, exc.DBAPIError)
"""What :meth:`Store.guard` looks at (:func:`_refusal`)."""


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{Path(data_dir) / 'gym.sqlite3'}"


def _private_sqlite_file(path: Path) -> None:
    """The SQLite file made (empty: a valid database) 0600 in a 0700 directory before SQLite opens
    it, so its -wal and -shm files, which SQLite creates with the database's own mode, are 0600 as
    well; those of an older gym are set to 0600 here (kit/private_files.py)."""
    private_dir(path.parent)
    os.close(open_private(path, os.O_RDWR | os.O_CREAT))
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", FILE_MODE)


_SQLITE_WRITERS: dict[str, threading.RLock] = {}
_SQLITE_WRITERS_GUARD = threading.Lock()


def _sqlite_writer(path: str) -> threading.RLock:
    """The in-process turn for one SQLite file, shared by every Store on it in this process.

    Every SQLite transaction here is a writer (BEGIN IMMEDIATE), and SQLite runs one writer at a
    time anyway; threads that queue on the database lock instead poll it from SQLite's busy
    handler, which sleeps 1, 2, 5 … 100 ms between tries, so under contention most of the time
    went to sleeping with the database free. Queued on this lock, the next thread starts as soon
    as the previous one commits. Other processes still meet at the database lock (busy timeout).
    Re-entrant, so a nested transaction on the same thread behaves as before (SQLite's own wait)."""
    key = str(Path(path).resolve())
    with _SQLITE_WRITERS_GUARD:
        return _SQLITE_WRITERS.setdefault(key, threading.RLock())


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
            if settings.sqlite_checkpoint_thread:  # the store's Checkpointer copies the WAL back
                cur.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
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


class Prepared:
    """A Core statement compiled once for one dialect and run straight on the DBAPI cursor.

    ``Connection.execute`` costs ~10x the driver's own time for a one-row ``UPDATE`` (cache-key
    walk, execution context, result wrapper); the ledger runs a few such statements per call.
    Only for statements whose binds are all given by name or constant (no Python-side column
    defaults: set ``updated_at`` and the like explicitly) and whose result columns need no
    type processing (integers, strings)."""

    def __init__(self, stmt: ClauseElement, dialect: Dialect):
        compiled = cast(SQLCompiler, stmt.compile(dialect=dialect))
        self.sql = str(compiled)
        self.returns_rows: bool | None = (
            True if isinstance(stmt, Select) else
            bool(stmt.returning_column_descriptions) if isinstance(stmt, UpdateBase) else None)
        """Whether running it gives rows; None: ask the cursor (psycopg's ``description`` builds
        an object per column each time it is read, ~12 % of a pipelined batch's time)."""
        self.order = tuple(compiled.positiontup or ()) if compiled.positional else None
        self.constants: dict[str, Any] = {}
        self.processors: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            if not bind.required:
                self.constants[name] = bind.effective_value
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                self.processors[name] = processor
        self._names = self.order if self.order is not None else tuple(dict.fromkeys(compiled.bind_names.values()))
        """Every bind's name, in the order the driver takes them (positional: one per place)."""
        self._plan = tuple((name, self.processors.get(name), self.constants.get(name, _GIVEN)) for name in self._names)
        """(name, its type's bind processor or None, its constant or ``_GIVEN``) per bind: walked
        once a run instead of merging and walking dicts (the ledger binds ~35 values a pair;
        the walk was a fifth of the store writer thread's Python)."""
        self._plain = not self.constants and not self.processors
        self._processed = tuple((name, self.processors.get(name)) for name in self._names) if not self.constants else None
        """(name, bind processor or None) per bind, for a statement with no constant: every value
        is given, so the walk needs no test for one (the ledger's statements but the close)."""

    def parameters(self, given: dict[str, Any]) -> Any:
        """The driver's parameters for the values ``given`` by name (a bind not given takes the
        statement's constant), each through its type's bind processor."""
        if self._plain:
            return given if self.order is None else tuple([given[name] for name in self._names])
        if self._processed is not None and self.order is not None:
            return tuple([given[name] if processor is None else processor(given[name])
                          for name, processor in self._processed])
        values = [
            value if processor is None else processor(value)
            for name, processor, constant in self._plan
            for value in (given[name] if constant is _GIVEN or name in given else constant,)  # one value: its name
        ]
        return tuple(values) if self.order is not None else dict(zip(self._names, values, strict=True))


_GIVEN = object()
"""A bind without a constant: its value is always given."""


_CURSORS = "rsigym.cursors"
"""Where a pooled connection keeps its cursors (its ``info``: (the DBAPI connection, cursors))."""


class Work:
    """One transaction on one pooled DBAPI connection (:meth:`Store.begin`)."""

    def __init__(self, store: Store, conn: PoolProxiedConnection):
        self._store, self._conn = store, conn
        self.dialect = store.dialect
        """The store's dialect name ("sqlite", "postgresql"): a unit may pick its statements by it."""
        self._cursors: list[Any] | None = None
        self._pipelining = False
        self._sent: list[Sent] = []

    def rows(self, stmt: ClauseElement, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        if self._pipelining:
            return self.send(stmt, params).rows()
        # :meth:`send` then :meth:`Sent.rows`, without the Sent between (a third of the
        # Python a hot statement costs outside the driver).
        cursor, prepared = self._run(stmt, params, 0)
        return self._fetch(cursor, prepared)

    def first(self, stmt: ClauseElement, params: dict[str, Any]) -> tuple[Any, ...] | None:
        found = self.rows(stmt, params)
        return found[0] if found else None

    def one(self, stmt: ClauseElement, params: dict[str, Any]) -> tuple[Any, ...]:
        found = self.rows(stmt, params)
        if len(found) != 1:
            raise exc.NoResultFound("expected one row") if not found else exc.MultipleResultsFound("expected one row")
        return found[0]

    def send(self, stmt: ClauseElement, params: dict[str, Any]) -> Sent:
        """Run ``stmt``; its answer is read by the :class:`Sent` returned. Inside :meth:`pipeline`
        the statement is only sent, and the next may be sent before its answer comes back."""
        sent = self._sent if self._pipelining else None
        cursor, prepared = self._run(stmt, params, len(sent) if sent is not None else 0)
        if sent is None:
            return Sent(self, cursor, prepared, pipelined=False)
        sent.append(Sent(self, cursor, prepared, pipelined=True))
        return sent[-1]

    def _run(self, stmt: ClauseElement, params: dict[str, Any], i: int) -> tuple[Any, Prepared]:
        """Run (or, in a pipeline, send) ``stmt`` on the connection's ``i``-th cursor: every
        statement of a unit of work goes through here."""
        prepared = self._store.prepared(stmt)
        cursor = self._cursor_for(i)
        try:
            cursor.execute(prepared.sql, prepared.parameters(params))
        except self._store.dbapi_error as err:
            raise self._failed(err, prepared.sql) from err
        return cursor, prepared

    def _fetch(self, cursor: Any, prepared: Prepared) -> list[tuple[Any, ...]]:
        """The rows a statement run on ``cursor`` answered (none for one that returns none)."""
        returns_rows = prepared.returns_rows
        try:
            has_rows = returns_rows if returns_rows is not None else cursor.description is not None
            found: list[tuple[Any, ...]] = cursor.fetchall() if has_rows else []
        except self._store.dbapi_error as err:
            raise self._failed(err, prepared.sql) from err
        return found

    def cursor(self) -> Any:
        """The connection's first kept cursor (:meth:`_cursor_for`)."""
        return self._cursor_for(0)

    def _cursor_for(self, i: int) -> Any:
        """The connection's ``i``-th cursor, kept with the connection for its next transactions
        (a new psycopg cursor, with its adapters and dumper caches, costs ~15 % of a unit):
        statements run one at a time use the first; a pipeline's ``i``-th statement, the ``i``-th."""
        cursors = self._cursors
        if cursors is None:
            kept = self._conn.info.get(_CURSORS)
            if kept is None or kept[0] is not self._conn.dbapi_connection:
                kept = self._conn.info[_CURSORS] = (self._conn.dbapi_connection, [])
            cursors = self._cursors = kept[1]
        while len(cursors) <= i:
            cursors.append(self._conn.cursor())
        return cursors[i]

    @property
    def pipelines(self) -> bool:
        """Whether :meth:`pipeline` sends statements without waiting (PostgreSQL); SQLite has no
        round trip to save."""
        return self.dialect == "postgresql"

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[list[Sent]]:
        """psycopg's pipeline mode: statements :meth:`send` inside go to the server without
        waiting for each answer; all have been answered (or one failed, and the transaction with
        it, raised here) when the block ends. Read their answers after it. Yields the list of
        the statements sent, in order, as they are sent."""
        sent: list[Sent] = []
        try:
            with self._conn.dbapi_connection.pipeline():  # type: ignore[union-attr]
                self._pipelining, self._sent = True, sent
                try:
                    yield sent
                finally:
                    self._pipelining = False
        except self._store.dbapi_error as err:
            raise self._store.wrapped(err, self._conn, None) from err

    def _failed(self, err: Any, sql: str | None) -> exc.StatementError:
        """A driver error as SQLAlchemy's. The connection's next transaction gets new cursors;
        these are left as they are (not closed): in a pipeline, the error of an earlier
        statement may surface while sending a later one, and which statements were answered is
        read from their cursors (:attr:`Sent.answered`)."""
        self._conn.info.pop(_CURSORS, None)
        return self._store.wrapped(err, self._conn, sql)


class Sent:
    """A statement :meth:`Work.send` ran or sent: its answer, read once."""

    __slots__ = ("_work", "_cursor", "_prepared", "_pipelined")

    def __init__(self, work: Work, cursor: Any, prepared: Prepared, *, pipelined: bool):
        self._work, self._cursor, self._prepared, self._pipelined = work, cursor, prepared, pipelined

    @property
    def answered(self) -> bool:
        """Whether the server answered it (after a failed pipeline: the statements before the
        one that failed were answered; that one and those after it were not)."""
        return not self._pipelined or getattr(self._cursor, "pgresult", None) is not None

    def rows(self) -> list[tuple[Any, ...]]:
        return self._work._fetch(self._cursor, self._prepared)

    def first(self) -> tuple[Any, ...] | None:
        found = self.rows()
        return found[0] if found else None


class _Held(threading.local):
    """What one thread holds of a :class:`Store`. The class's values are each thread's first:
    reading an attribute a thread never set costs an ``AttributeError`` caught inside
    ``getattr`` (~0.8 µs against ~0.2), and the event loop's thread asks before every reservation
    and settlement (:meth:`Store.in_transaction`)."""

    depth = 0
    """This thread's open transactions on the store."""
    keep = False
    """Inside :meth:`Store.keeping_connection`."""
    kept: PoolProxiedConnection | None = None
    """The connection kept there, once taken."""


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
        self.record_anchor: ChainAnchor | None = None
        """Where the heads of the record chains stored here are anchored outside the store
        (services/records/record_anchor.py): set by the gym's :class:`ServiceContext`; None for a
        bare store (tests, benches), whose chains are checked without an anchor."""
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        if url.startswith("sqlite:///"):
            _private_sqlite_file(Path(url.removeprefix("sqlite:///")))
        self.engine = _make_engine(url, self.settings, schema)
        sqlite_file = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
        self._writer = _sqlite_writer(sqlite_file) if sqlite_file is not None else None
        self._checkpoints = (Checkpointer(sqlite_file, self.settings.sqlite_busy_timeout_ms / 1000)
                             if sqlite_file is not None and self.settings.sqlite_checkpoint_thread else None)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._prepared: dict[ClauseElement, Prepared] = {}
        self._limiter = anyio.CapacityLimiter(self.settings.pool_size + self.settings.max_overflow)
        self._held = _Held()
        self._unwaiting_conn: PoolProxiedConnection | None = None
        """SQLite: the connection of transactions that must not wait (:meth:`_unwaiting`)."""
        self.group: GroupCommit[Work] = GroupCommit(
            self,
            max_batch=self.settings.group_commit_max,
            wait_s=max(self.settings.pool_timeout_s, self.settings.sqlite_busy_timeout_ms / 1000),
            inline=self._checkpoints is not None,
        )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """One unit of work: committed on success, rolled back on any error."""
        with self.guard(), self._turn(), self._sessions() as session, session.begin():
            yield session

    def batched(self, fn: Callable[[Work], T], *, clean: tuple[type[BaseException], ...] = ()) -> T:
        """``fn(work)`` in a transaction that concurrent callers' work may share, with one commit
        for all (:mod:`storage.group_commit`: the contract ``fn`` keeps, what fails how).
        For short, hot writes: the ledger's reservations and settlements."""
        return self.group.run(fn, clean)

    async def batched_async(self, fn: Callable[[Work], T], *, clean: tuple[type[BaseException], ...] = (),
                            orphaned: Callable[[T], None] | None = None) -> T:
        """:meth:`batched` from an event loop, without a worker-thread trip per call
        (:meth:`GroupCommit.run_async`; ``orphaned`` undoes the work of a caller cancelled
        after its work was taken)."""
        return await self.group.run_async(fn, clean, orphaned)

    def in_transaction(self) -> bool:
        """Whether this thread is inside a transaction of this store."""
        return self._held.depth > 0

    @contextlib.contextmanager
    def begin(self) -> Iterator[Work]:
        """:meth:`transaction` for hot paths: prepared Core statements run on a pooled DBAPI
        connection, with no ORM session and no per-statement engine machinery. The same
        guarantees: committed on success, rolled back on any error, driver errors raised as
        SQLAlchemy's (so :meth:`guard` refuses with 503 ``store_unavailable``), a connection
        lost mid-call invalidated, not pooled again. (For an event loop's thread, which must
        not wait for another writer: :meth:`run_unwaiting`.)"""
        with self.guard(), self._turn():
            keep = self._held.depth == 1 and self._held.keep
            conn = self._kept() if keep else self._connection()
            committing = False
            try:
                try:
                    work = Work(self, conn)
                    if self._writer is not None:
                        self._begin_immediate(work, wait=True)
                    yield work
                    committing = True
                    conn.commit()
                except self.dbapi_error as err:  # BEGIN or COMMIT (Work raises its own wrapped)
                    raise self.wrapped(err, conn, None) from err
            except BaseException as err:
                if conn.is_valid:
                    with contextlib.suppress(self.dbapi_error):
                        conn.rollback()
                elif keep and not committing and isinstance(err, exc.DBAPIError):
                    # The kept connection was found lost before anything could commit (the
                    # server dropped it while it sat between batches): nothing happened, and
                    # the caller may run the work again on a fresh one (GroupCommit._alone).
                    raise KeptConnectionLost("the gym's store connection was lost; the call was refused") from err
                raise
            finally:
                if not keep:
                    conn.close()
                elif not conn.is_valid:  # lost: the next transaction takes a fresh one from the pool
                    self._held.kept = None
                    conn.close()

    def run_unwaiting(self, fn: Callable[[Work], T]) -> T:
        """``fn(work)`` in a transaction that never waits for another writer, in this process or
        another: :class:`WouldWait` is raised instead, before anything ran. SQLite only, for an
        event loop's thread, which must not block (a lone caller's reservation or settlement:
        :meth:`GroupCommit.run_async`). Otherwise as :meth:`begin`: committed on success,
        rolled back on any error, driver errors raised as SQLAlchemy's, an unreachable store or
        a lost connection as :class:`StoreUnavailable`.

        Written out rather than as :meth:`begin`'s three generator context managers (the
        guard, the writer's turn, the transaction), whose entries and exits cost as much as
        a one-row statement: this runs twice on every sequential call the gateway meters."""
        writer, held = self._writer, self._held
        assert writer is not None, "run_unwaiting is for SQLite"
        held.depth += 1
        try:
            if not writer.acquire(blocking=False):
                raise WouldWait("another thread of this process is writing to the store")
            try:
                conn = self._unwaiting()
                try:
                    try:
                        work = Work(self, conn)
                        self._begin_immediate(work, wait=False)
                        result = fn(work)
                        conn.commit()
                    except self.dbapi_error as err:  # BEGIN or COMMIT (Work raises its own wrapped)
                        raise self.wrapped(err, conn, None) from err
                except BaseException:
                    if conn.is_valid:
                        with contextlib.suppress(self.dbapi_error):
                            conn.rollback()
                    else:  # lost: the next such transaction takes a fresh one
                        self._unwaiting_conn = None
                        conn.close()
                    raise
                return result
            finally:
                writer.release()
                if self._checkpoints is not None:
                    self._checkpoints.wrote()
        except _GUARDED as err:
            refusal = _refusal(err)
            if refusal is None:
                raise
            raise refusal from err
        finally:
            held.depth -= 1

    def _begin_immediate(self, work: Work, wait: bool) -> None:
        """SQLite: take the write lock up front, as the engine's "begin" event does (pysqlite's
        transaction control is off, see _make_engine), on the cursor the transaction's first
        statement will use. Not ``wait``-ing (on :meth:`_unwaiting`'s connection, which has no
        busy timeout): :class:`WouldWait` if another connection holds it."""
        try:
            work.cursor().execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as err:
            if not wait and err.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise WouldWait("another connection holds the SQLite write lock") from err
            raise

    def _unwaiting(self) -> PoolProxiedConnection:
        """SQLite: the connection of the transactions that must not wait (:meth:`begin` with
        ``wait=False``), with no busy timeout, so that its ``BEGIN IMMEDIATE`` fails at once
        when another connection holds the write lock. Taken from the pool at the first such
        transaction (:class:`WouldWait` if the pool would make it wait) and kept, with the
        writer's page cache, until the store is disposed; used only under the writer's turn."""
        conn = self._unwaiting_conn
        if conn is None:
            if cast(QueuePool, self.engine.pool).checkedout() >= self.settings.pool_size + self.settings.max_overflow:
                raise WouldWait("every pooled store connection is in use")
            conn = self._connection()
            try:
                self._pragma(conn, "busy_timeout=0")
            except BaseException:
                conn.close()
                raise
            self._writer_cache(conn, self.settings.sqlite_writer_cache_mib)
            self._unwaiting_conn = conn
        return conn

    def _pragma(self, conn: PoolProxiedConnection, pragma: str) -> None:
        cursor = conn.cursor()
        try:
            cursor.execute(f"PRAGMA {pragma}")
        except self.dbapi_error as err:
            raise self.wrapped(err, conn, None) from err
        finally:
            cursor.close()

    @contextlib.contextmanager
    def keeping_connection(self) -> Iterator[None]:
        """Inside, this thread's :meth:`begin` transactions share one pooled connection, taken
        at the first and given back here, instead of one checkout (and, on PostgreSQL, one
        pre-ping round trip) each: for the store's writer thread (storage/group_commit.py),
        which runs one batch after another. Only the outermost transaction uses it; one found
        lost is replaced at the next."""
        self._held.keep, self._held.kept = True, None
        try:
            yield
        finally:
            self._held.keep = False
            self.release_kept()

    @contextlib.contextmanager
    def read(self) -> Iterator[Work]:
        """:meth:`begin` for reads only: no ``BEGIN IMMEDIATE`` and no writer's turn on SQLite
        (in WAL mode a read waits for no writer), each statement its own snapshot; whatever a
        caller wrote by mistake is rolled back when the connection goes back to the pool."""
        with self.guard():
            conn = self._connection()
            try:
                yield Work(self, conn)
            finally:
                conn.close()

    def _kept(self) -> PoolProxiedConnection:
        """This thread's kept connection (:meth:`keeping_connection`), taken from the pool (and
        tested there, PostgreSQL's pre-ping) when it has none."""
        kept = self._held.kept
        if kept is None:
            kept = self._held.kept = self._connection()
            self._writer_cache(kept, self.settings.sqlite_writer_cache_mib)
        return kept

    def release_kept(self) -> None:
        """Give this thread's kept connection back to the pool (it stays in keeping mode: the next
        transaction takes one again). The writer thread does when it has been idle a while, so a
        connection the server dropped meanwhile is found by the pool's test, not by a batch."""
        kept, self._held.kept = self._held.kept, None
        if kept is not None:
            try:
                self._writer_cache(kept, 0)  # pooled again with SQLite's default: the pages above it freed
            finally:
                kept.close()

    def _writer_cache(self, conn: PoolProxiedConnection, mib: int) -> None:
        """SQLite: the kept connection's page cache, ``mib`` MiB (0: SQLite's default), see
        ``StoreSettings.sqlite_writer_cache_mib``. A failure leaves the cache as it was."""
        if self._writer is None or not conn.is_valid or not self.settings.sqlite_writer_cache_mib:
            return
        cursor = conn.cursor()
        try:
            cursor.execute(f"PRAGMA cache_size={-1024 * mib if mib else SQLITE_DEFAULT_CACHE}")
        except self.dbapi_error:
            log.warning("could not set the SQLite writer connection's page cache", exc_info=True)
        finally:
            cursor.close()

    def _connection(self) -> PoolProxiedConnection:
        """A pooled DBAPI connection; a driver error raised as SQLAlchemy's (see :meth:`guard`)."""
        try:
            return self.engine.raw_connection()
        except self.dbapi_error as err:
            raise self.wrapped(err, None, None) from err

    @property
    def dbapi_error(self) -> type[Exception]:
        return cast(type[Exception], self.engine.dialect.loaded_dbapi.Error)

    def wrapped(self, err: Any, conn: PoolProxiedConnection | None, sql: str | None) -> exc.StatementError:
        """A driver error as SQLAlchemy would raise it; a lost connection is invalidated."""
        dialect = self.engine.dialect
        lost = dialect.is_disconnect(err, conn.dbapi_connection if conn is not None else None, None)
        if conn is not None and lost and conn.is_valid:
            conn.invalidate(err)
        return exc.DBAPIError.instance(sql, None, err, self.dbapi_error, connection_invalidated=lost, dialect=dialect)

    def prepared(self, stmt: ClauseElement) -> Prepared:
        """``stmt`` compiled for this store, once: pass module-level statements only (each one
        given is kept for the store's lifetime)."""
        found = self._prepared.get(stmt)
        if found is None:
            found = self._prepared.setdefault(stmt, Prepared(stmt, self.engine.dialect))
        return found

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """SQLite: wait for this process's writer turn (see :func:`_sqlite_writer`), at most
        the busy timeout, then refuse as a locked database would. Counts this thread's open
        transactions (:meth:`in_transaction`)."""
        self._held.depth += 1
        try:
            if self._writer is None:
                yield
                return
            if not self._writer.acquire(timeout=self.settings.sqlite_busy_timeout_ms / 1000):
                raise StoreUnavailable("the gym's store is busy; the call was refused")
            try:
                yield
            finally:
                self._writer.release()
                if self._checkpoints is not None:
                    self._checkpoints.wrote()
        finally:
            self._held.depth -= 1

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except _GUARDED as err:
            refusal = _refusal(err)
            if refusal is None:
                raise
            raise refusal from err

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking store work off the event loop."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision, once however many replicas start
        together: on PostgreSQL under a transaction-level advisory lock (the others wait, then
        find nothing left to do); SQLite's BEGIN IMMEDIATE already serialises writers."""
        with self.guard(), self._turn(), self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SET LOCAL statement_timeout = 0"))  # waiting for another replica's migration is fine
                conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def dispose(self) -> None:
        self.group.close()  # its writer thread's kept connection back to the pool, closed below
        if self._checkpoints is not None:
            self._checkpoints.close()
        unwaiting, self._unwaiting_conn = self._unwaiting_conn, None
        if unwaiting is not None:
            unwaiting.invalidate()  # closed, never lent out with no busy timeout
        self.engine.dispose()
        self.key_events.close()


def _refusal(err: BaseException) -> StoreUnavailable | None:
    """What a store error becomes for the caller (:meth:`Store.guard`): an unreachable store or a
    lost connection a 503 ``store_unavailable`` (the gym fails closed); None: raised as it is."""
    if isinstance(err, UNAVAILABLE_ERRORS):
        return StoreUnavailable("the gym's store cannot be reached; the call was refused")
    if isinstance(err, exc.DBAPIError) and err.connection_invalidated:
        return StoreUnavailable("the gym's store connection was lost; the call was refused")
    return None


def alembic_config() -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg
