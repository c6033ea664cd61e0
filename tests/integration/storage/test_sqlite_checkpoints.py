"""A SQLite store copies its WAL back into the database on a thread of its own
(storage/sqlite_checkpoints.py): commits no longer stop for a checkpoint's ``fsync``s, and
nothing committed is lost or left only in the WAL once writes stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from access.keys import KeyRegistry
from access.presets import preset_policy
from billing.ledger import Ledger
from kit.config import GymConfig
from kit.settings import StoreSettings
from storage import sqlite_checkpoints
from storage.sqlite_checkpoints import Checkpointer
from storage.store import Store, sqlite_url

DEADLINE_S = 30.0


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def _migrated(tmp_path: Path) -> Iterator[tuple[Store, Checkpointer]]:
    """A migrated SQLite store of the test's own and its checkpointer; disposed afterwards."""
    store = Store(sqlite_url(tmp_path), StoreSettings())
    try:
        store.migrate()
        assert store._checkpoints is not None
        yield store, store._checkpoints
    finally:
        store.dispose()


@contextlib.contextmanager
def _wal_index(db: Path) -> Iterator[int | None]:
    """The database's WAL index, opened as the checkpointer opens it; closed afterwards."""
    index = sqlite_checkpoints._open_index(str(db))
    try:
        yield index
    finally:
        if index is not None:
            os.close(index)


def _pairs(store: Store, n: int) -> tuple[str, Ledger]:
    """``n`` reservations settled on one new key (2n ledger commits), as the gateway makes them."""
    key, _ = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=10**12)
    ledger = Ledger(store)
    for i in range(n):
        res = ledger.reserve(key["id"], service="rollout", operation="chat.completions", estimate_nusd=1_000,
                             request_id=f"req_{i}", chain_ids=(key["id"],))
        ledger.settle(res.id, 700)
    return key["id"], ledger


def _in_database_file_alone(db: Path, tmp: Path, key_id: str) -> tuple[int, int]:
    """(ledger rows, spent) of ``key_id`` as the database file holds them without its WAL: what a
    checkpoint has copied back (a copy of the file alone, opened elsewhere, never sees the WAL)."""
    alone = tmp / "alone" / db.name
    alone.parent.mkdir(exist_ok=True)
    shutil.copyfile(db, alone)
    with sqlite3.connect(alone) as conn:
        rows = conn.execute("SELECT count(*) FROM ledger WHERE key_id = ?", (key_id,)).fetchone()[0]
        spent = conn.execute("SELECT spent_nusd FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    return rows, spent[0] if spent else -1


def test_commits_reach_the_database_file_without_a_checkpoint_of_their_own(sqlite_store: Store, tmp_path: Path) -> None:
    store = sqlite_store
    db = Path(store.url.removeprefix("sqlite:///"))
    with store.engine.connect() as conn:  # the request path checkpoints only past the backstop
        assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == sqlite_checkpoints.BACKSTOP_PAGES
    key_id, _ = _pairs(store, 150)  # ~300 commits, a few hundred WAL pages: under SQLite's own 1,000

    checkpointer = store._checkpoints
    assert checkpointer is not None
    _until(lambda: checkpointer.last is not None and checkpointer.last[0] == 0
           and checkpointer.last[1] == checkpointer.last[2] and not checkpointer._dirty.is_set(),
           "the checkpointer copied every WAL frame back")
    assert _in_database_file_alone(db, tmp_path, key_id) == (150, 150 * 700)


def test_the_thread_leaves_when_idle_and_the_next_write_brings_it_back(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.setattr(sqlite_checkpoints, "IDLE_S", 0.2)
    with _migrated(tmp_path) as (store, checkpointer):
        _pairs(store, 5)
        _until(lambda: checkpointer._thread is None, "the idle thread left")
        runs = checkpointer.checkpoints

        key_id, _ = _pairs(store, 40)  # a write after it left: a new thread checkpoints it
        _until(lambda: checkpointer.checkpoints > runs and checkpointer._thread is None,
               "a new thread checkpointed the new writes, then left")
        assert _in_database_file_alone(tmp_path / "gym.sqlite3", tmp_path, key_id) == (40, 40 * 700)


def test_writers_racing_the_thread_leaving_always_have_their_writes_checkpointed(monkeypatch: pytest.MonkeyPatch,
                                                                                 tmp_path: Path) -> None:
    """Writes that land just as the thread decides it is idle: the writer sets the flag before it
    looks for the thread, so either the leaving thread sees the flag or the writer starts another."""
    monkeypatch.setattr(sqlite_checkpoints, "IDLE_S", 0.01)
    monkeypatch.setattr(sqlite_checkpoints, "POLL_S", 0.0)
    monkeypatch.setattr(sqlite_checkpoints, "MAX_DELAY_S", 0.0)
    with _migrated(tmp_path) as (store, checkpointer):
        key_id, ledger = _pairs(store, 1)
        for i in range(60):  # each write around the moment the previous thread gives up
            res = ledger.reserve(key_id, service="rollout", operation="chat.completions", estimate_nusd=1_000,
                                 request_id=f"race_{i}", chain_ids=(key_id,))
            ledger.settle(res.id, 700)
            time.sleep(0.005 * (i % 4))
        _until(lambda: checkpointer._thread is None and checkpointer.last is not None
               and checkpointer.last[1] == checkpointer.last[2], "every write checkpointed, the thread gone")
        assert _in_database_file_alone(tmp_path / "gym.sqlite3", tmp_path, key_id) == (61, 61 * 700)


def test_the_wal_index_says_how_many_frames_wait_as_a_checkpoint_then_reports(tmp_path: Path) -> None:
    db = tmp_path / "plain.sqlite3"
    writer = sqlite3.connect(db, isolation_level=None)
    other = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("CREATE TABLE t (x BLOB)")
        with _wal_index(db) as index:
            for _ in range(7):
                writer.execute("INSERT INTO t VALUES (randomblob(6000))")  # two overflow pages and more
            waiting = sqlite_checkpoints.waiting_frames(index)
            busy, frames, copied = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            assert (busy, copied) == (0, frames) and waiting == frames > 14
            assert sqlite_checkpoints.waiting_frames(index) == 0  # all copied back
            writer.execute("INSERT INTO t VALUES (1)")  # the WAL starts over: one transaction's frames wait
            assert sqlite_checkpoints.waiting_frames(index) == other.execute(
                "PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1] >= 1
    finally:
        writer.close()
        other.close()
    assert sqlite_checkpoints.waiting_frames(None) is None


def test_a_checkpoint_waits_for_enough_frames_or_the_longest_delay(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """Few frames and a long delay: nothing checkpointed yet. Enough frames: checkpointed without
    waiting out the delay. Few frames and a short delay: checkpointed when it runs out."""
    monkeypatch.setattr(sqlite_checkpoints, "POLL_S", 0.01)
    monkeypatch.setattr(sqlite_checkpoints, "MAX_DELAY_S", 3600.0)
    monkeypatch.setattr(sqlite_checkpoints, "TARGET_FRAMES", 10**9)
    with _migrated(tmp_path) as (store, checkpointer):
        key_id, _ = _pairs(store, 5)
        time.sleep(0.5)  # fifty polls
        assert checkpointer.checkpoints == 0
        with _wal_index(tmp_path / "gym.sqlite3") as index:
            assert (sqlite_checkpoints.waiting_frames(index) or 0) > 10  # the migration's and the pairs' frames

        monkeypatch.setattr(sqlite_checkpoints, "TARGET_FRAMES", 1)  # the delay is still an hour
        _until(lambda: checkpointer.checkpoints == 1 and checkpointer.last is not None
               and checkpointer.last[1] == checkpointer.last[2], "checkpointed once enough frames waited")
        assert _in_database_file_alone(tmp_path / "gym.sqlite3", tmp_path, key_id) == (5, 5 * 700)

        monkeypatch.setattr(sqlite_checkpoints, "TARGET_FRAMES", 10**9)
        monkeypatch.setattr(sqlite_checkpoints, "MAX_DELAY_S", 0.05)
        later, _ = _pairs(store, 3)
        _until(lambda: checkpointer.checkpoints >= 2 and not checkpointer._dirty.is_set(),
               "checkpointed when the delay ran out")
        assert _in_database_file_alone(tmp_path / "gym.sqlite3", tmp_path, later) == (3, 3 * 700)


def test_without_a_readable_wal_index_it_checkpoints_every_poll(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setattr(sqlite_checkpoints, "_open_index", lambda path: None)
    monkeypatch.setattr(sqlite_checkpoints, "POLL_S", 0.01)
    monkeypatch.setattr(sqlite_checkpoints, "MAX_DELAY_S", 3600.0)
    monkeypatch.setattr(sqlite_checkpoints, "TARGET_FRAMES", 10**9)
    with _migrated(tmp_path) as (store, checkpointer):
        key_id, _ = _pairs(store, 5)
        _until(lambda: checkpointer.checkpoints >= 1 and not checkpointer._dirty.is_set(),
               "checkpointed a poll after the writes")
        assert _in_database_file_alone(tmp_path / "gym.sqlite3", tmp_path, key_id) == (5, 5 * 700)


def test_dispose_ends_the_thread_and_keeps_every_commit(tmp_path: Path) -> None:
    store = Store(sqlite_url(tmp_path), StoreSettings())
    store.migrate()
    checkpointer = store._checkpoints
    assert checkpointer is not None
    key_id, _ = _pairs(store, 30)
    thread = checkpointer._thread
    store.dispose()
    assert thread is None or not thread.is_alive()
    assert not [t for t in threading.enumerate() if t is thread]

    again = Store(sqlite_url(tmp_path), StoreSettings())  # the WAL's commits are still there
    try:
        with again.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM ledger WHERE key_id = ?",
                                        (key_id,)).scalar() == 30
    finally:
        again.dispose()


def test_a_forked_child_checkpoints_its_own_writes(tmp_path: Path) -> None:
    """A process forked from one whose checkpoint thread runs has no such thread: its writes start one."""
    with _migrated(tmp_path) as (store, checkpointer):
        _pairs(store, 3)
        assert checkpointer._thread is not None
        pid = os.fork()
        if pid == 0:  # the child: write, wait for its own thread to checkpoint, report by exit code
            code = 1
            try:
                store.engine.dispose(close=False)  # the parent's connections stay the parent's
                child, before = checkpointer, checkpointer.checkpoints
                key_id, _ = _pairs(store, 20)
                _until(lambda: child.checkpoints > before and child.last is not None
                       and child.last[1] == child.last[2], "the child's own thread checkpointed")
                code = 0 if _in_database_file_alone(tmp_path / "gym.sqlite3", tmp_path, key_id) == (20, 20 * 700) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_turned_off_the_store_leaves_checkpoints_to_sqlite_as_before(tmp_path: Path) -> None:
    store = Store(sqlite_url(tmp_path), StoreSettings(sqlite_checkpoint_thread=False))
    try:
        store.migrate()
        _pairs(store, 3)
        assert store._checkpoints is None
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1000  # SQLite's default
    finally:
        store.dispose()
