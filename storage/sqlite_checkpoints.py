"""SQLite's WAL checkpoints, off the request path.

In WAL mode a commit appends pages to the ``-wal`` file; a *checkpoint* copies them back into the
database and syncs both files. By default SQLite runs one inside whichever commit takes the WAL
past 1,000 pages, so every few hundred ledger writes one reservation or settlement waited ~3 ms
for two ``fsync``s: the reservations' p99 was these waits. Turning that off alone is worse: a
WAL that is never checkpointed grows without bound and every read searches a longer index (every
reservation slower).

So a store on SQLite keeps one :class:`Checkpointer`: a thread with its own connection that,
after writes, runs ``PRAGMA wal_checkpoint(PASSIVE)`` — it copies what it can without taking any
lock a writer or reader needs, so neither waits for it, and Python's ``sqlite3`` releases the
GIL while it syncs. The store's own connections keep an automatic checkpoint only as a
backstop (``BACKSTOP_PAGES``), for when this thread cannot keep up or is gone. Durability is
unchanged: a commit is in the WAL before it returns, checkpointed or not.

How often: about as often as SQLite itself would, once ``TARGET_FRAMES`` (1,000) frames wait to be
copied, and at the latest ``MAX_DELAY_S`` after a write. Every checkpoint costs two ``fsync``s and
a thread's wake-up whatever it copies. Checkpointing 0.1 s after any write (as this thread once
did) made a gym serving a steady trickle of calls run ~10 checkpoints a second, each copying a few
dozen frames, on the same cores as the calls; now ~1 (docs/performance.md, "SQLite checkpoints off
the request path"). The thread learns how many frames wait without taking a lock: it reads them
from the WAL index (the ``-shm`` file, whose layout SQLite documents for the unix VFS: ``mxFrame``
at byte 16 of the header, the checkpoint's ``nBackfill`` at byte 96, both native-endian). Where
that file cannot be read, it checkpoints every ``POLL_S`` after writes, as it did before.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
import time
import weakref

log = logging.getLogger("rsigym.store")

BACKSTOP_PAGES = 8_000
"""``wal_autocheckpoint`` of the store's own connections: a commit checkpoints itself only past
this many WAL pages (~32 MiB), 8× SQLite's default, which the checkpointer keeps it far below."""
POLL_S = 0.1
"""After a write, how often the checkpointer looks at how many WAL frames wait to be copied."""
TARGET_FRAMES = 1_000
"""Checkpoint once this many frames wait (SQLite's own ``wal_autocheckpoint`` default: ~4 MiB)."""
MAX_DELAY_S = 1.0
"""Checkpoint at the latest this long after the first write since the last checkpoint."""
_MX_FRAME, _BACKFILL = 16, 96
"""Byte offsets in the WAL index of the last committed frame (the header's ``mxFrame``) and of the
last frame copied back (``nBackfill`` of the checkpoint info that follows the header's two copies)."""
IDLE_S = 5.0
"""The checkpointer's thread ends after this long without a write (and starts again with the next)."""


_LIVE: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def _after_fork() -> None:
    """A forked child has none of its parent's threads: its checkpointers start their own."""
    for checkpointer in list(_LIVE):
        checkpointer._lock = threading.Lock()
        checkpointer._thread = None


os.register_at_fork(after_in_child=_after_fork)


def _open_index(path: str) -> int | None:
    """A read-only descriptor of the database's WAL index, or None (no such file: the thread then
    checkpoints every ``POLL_S`` after writes)."""
    try:
        return os.open(path + "-shm", os.O_RDONLY)
    except OSError:
        return None


def waiting_frames(index: int | None) -> int | None:
    """How many committed WAL frames are not yet copied back into the database, read from the WAL
    index without a lock (a torn read only moves one checkpoint); None when it cannot be read."""
    if index is None:
        return None
    try:
        head = os.pread(index, _BACKFILL + 4, 0)
    except OSError:
        return None
    if len(head) < _BACKFILL + 4:
        return None
    last = int.from_bytes(head[_MX_FRAME:_MX_FRAME + 4], sys.byteorder)
    copied = int.from_bytes(head[_BACKFILL:_BACKFILL + 4], sys.byteorder)
    return max(0, last - copied)


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
        # Before the read of _thread below: see _run's exit. Already set: the thread has not yet
        # cleared it, and the checkpoint it runs after clearing it covers this commit. Setting an
        # Event takes its lock and notifies (~2 µs); reading it does not.
        if not self._dirty.is_set():
            self._dirty.set()
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
        index = _open_index(self.path)
        try:
            while True:
                if not self._dirty.wait(IDLE_S) or self._closed.is_set():
                    with self._lock:
                        # A writer sets _dirty before it looks for this thread: either it is
                        # seen set here, or the writer finds _thread None and starts another.
                        if self._closed.is_set() or not self._dirty.is_set():
                            self._thread = None
                            return
                if self._gathered(index):
                    continue
                self._dirty.clear()
                self.checkpoint(conn)
        finally:
            conn.close()
            if index is not None:
                os.close(index)

    def _gathered(self, index: int | None) -> bool:
        """Wait, after a write, until ``TARGET_FRAMES`` frames wait to be copied or ``MAX_DELAY_S``
        has passed (every ``POLL_S`` when the WAL index cannot be read). True: closed meanwhile."""
        since = time.monotonic()
        while not self._closed.wait(POLL_S):
            waiting = waiting_frames(index)
            if waiting is None or waiting >= TARGET_FRAMES or time.monotonic() - since >= MAX_DELAY_S:
                return False
        return True

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
