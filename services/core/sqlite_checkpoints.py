"""SQLite's WAL checkpoints, off the request path.

In WAL mode a commit appends pages to the ``-wal`` file; a *checkpoint* copies them back into the
database and syncs both files. By default SQLite runs one inside whichever commit takes the WAL
past 1,000 pages, so every few hundred ledger writes one reservation or settlement waited ~3 ms
for two ``fsync``s (measured in the gym's own process: a reservation's p99 2.9 ms against a p50
of 0.2 ms, spikes every ~0.3 s under sequential calls). Turning that off alone is worse: a WAL
that is never checkpointed grows without bound and every read searches a longer index
(reservations 0.21 → 0.33 ms p50 over 2,000 calls).

So a store on SQLite keeps one :class:`Checkpointer`: a thread with its own connection that,
after writes, runs ``PRAGMA wal_checkpoint(PASSIVE)`` — it copies what it can without taking any
lock a writer or reader needs, so neither waits for it, and Python's ``sqlite3`` releases the
GIL while it syncs. The store's own connections keep an automatic checkpoint only as a
backstop (``BACKSTOP_PAGES``), for when this thread cannot keep up or is gone. Durability is
unchanged: a commit is in the WAL before it returns, checkpointed or not.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import weakref

log = logging.getLogger("rsigym.store")

BACKSTOP_PAGES = 8_000
"""``wal_autocheckpoint`` of the store's own connections: a commit checkpoints itself only past
this many WAL pages (~32 MiB), 8× SQLite's default, which the checkpointer keeps it far below."""
DELAY_S = 0.1
"""After a write, how long the checkpointer waits for more before it checkpoints them all."""
IDLE_S = 5.0
"""The checkpointer's thread ends after this long without a write (and starts again with the next)."""


_LIVE: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def _after_fork() -> None:
    """A forked child has none of its parent's threads: its checkpointers start their own."""
    for checkpointer in list(_LIVE):
        checkpointer._lock = threading.Lock()
        checkpointer._thread = None


os.register_at_fork(after_in_child=_after_fork)


class Checkpointer:
    """Checkpoints one SQLite database's WAL shortly after writes, on a thread of its own."""

    def __init__(self, path: str, busy_timeout_s: float):
        self.path, self.busy_timeout_s = path, busy_timeout_s
        self._dirty = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.checkpoints = 0
        """Checkpoints run so far."""
        self.last: tuple[int, int, int] | None = None
        """The last checkpoint's answer: (1 if it could not finish, WAL frames, frames now in the
        database file); read by tests."""
        _LIVE.add(self)

    def wrote(self) -> None:
        """Note a commit (cheap: called after every write transaction)."""
        self._dirty.set()  # before the read of _thread below: see _run's exit
        if self._thread is None and not self._closed.is_set():
            with self._lock:
                if self._thread is None and not self._closed.is_set():
                    self._thread = threading.Thread(target=self._run, name="rsigym-sqlite-checkpoints", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as err:  # the backstop checkpoints meanwhile; the next write starts a thread again
            log.warning("no checkpoints of %s: %s", self.path, err)
            with self._lock:
                self._thread = None
            return
        try:
            while True:
                if not self._dirty.wait(IDLE_S) or self._closed.is_set():
                    with self._lock:
                        # A writer sets _dirty before it looks for this thread: either it is
                        # seen set here, or the writer finds _thread None and starts another.
                        if self._closed.is_set() or not self._dirty.is_set():
                            self._thread = None
                            return
                if self._closed.wait(DELAY_S):
                    continue
                self._dirty.clear()
                self.checkpoint(conn)
        finally:
            conn.close()

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.last = (busy, frames, copied)
            self.checkpoints += 1
        except sqlite3.Error as err:  # the backstop checkpoints instead; the next write tries again
            log.warning("checkpoint of %s failed: %s", self.path, err)

    def close(self) -> None:
        """Stop the thread (it ends within a moment; the WAL is left as it is, all of it committed)."""
        self._closed.set()
        self._dirty.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
