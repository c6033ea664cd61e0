"""Each run's record-chain head, anchored outside the store (services/records/events.py).

The head row in ``record_heads`` is sealed with an HMAC, but a seal only says that the platform
wrote it once: someone with write access to the store can delete a chain's later events and put
back an older head row, whose seal is still valid, and the shorter chain reads as intact. So the
platform also writes every head it commits somewhere apart from the store (which those who can
write the store should not be able to write), and the check compares the two (``rolled_back`` when the store's chain ends before, or differs at, the
anchored head):

* **embedded** (no Redis): an append-only file in the data dir (``<data-dir>/record-anchor.log``,
  0600, opened ``O_APPEND``, fsync'd). Each line holds a run id, a sequence number, the event
  hash and an HMAC under the internal secret that also covers the previous line's HMAC, so a line
  cannot be changed, dropped or reordered without breaking every seal after it;
* **distributed** (``RSIGYM_REDIS_URL``): one Redis hash per run, one sealed field per anchored
  head, added by a Lua script that only ever adds heads past the last one and never changes one.

Every head anchored is kept, not only the last: a chain cut back to an older head and then
extended again by the platform past the old head would otherwise launder the cut, but its new
events differ from the anchored ones at the same sequence numbers.

Writing costs an append almost nothing: the head is handed over when its transaction commits
(a SQLAlchemy ``after_commit`` hook; a rolled-back append hands nothing) to a writer thread,
which writes everything handed over meanwhile in one go — one line per run and one fsync per
batch on the file, one pipelined round trip on Redis. Until that batch is durable (milliseconds)
the anchor is behind the store, which the check accepts; it never accepts the store behind the
anchor. A check first waits for this process's own pending writes (:meth:`RecordAnchor.flush`).

An anchor that cannot be read, or that has no entry for a run with events, makes the check
*unverifiable* — never silently intact (services/records/events.py, ``ChainReport``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session

from kit.settings import RecordAnchorSettings, RedisSettings
from services.records.anchor_backends import FILE_NAME, AnchorUnavailable, FileAnchor, Mark, RedisAnchor, seal
from storage.store import ChainAnchor

if TYPE_CHECKING:
    from kit.settings import GymSettings

log = logging.getLogger("rsigym.records.anchor")

__all__ = ["FILE_NAME", "AnchorBackend", "AnchorUnavailable", "FileAnchor", "Mark", "RecordAnchor", "RedisAnchor",
           "anchor_for", "note_on_commit"]

_PENDING = "rsigym.record_anchor"
"""Where a session keeps the heads its transaction appended until it commits."""


class AnchorBackend(Protocol):
    where: str
    """For reports: which file or Redis it is."""

    def advance(self, marks: dict[str, Mark]) -> list[str]:
        """Make ``marks`` durable, each only if it is past the run's last anchored head; the run
        ids whose last anchored head was past (or forked from) the mark given."""
        ...

    def read(self, run_id: str) -> list[Mark]:
        """Every head anchored for the run, in order (none: empty); :class:`AnchorUnavailable`
        when the anchor cannot tell."""
        ...

    def release(self) -> None:
        """Give back what writing holds (a file descriptor, connections) while the anchor idles."""
        ...


# -- the writer in front of a backend --------------------------------------------------------------


class RecordAnchor:
    """A backend and the thread that writes to it. :meth:`note` (called when an append commits)
    only queues; the thread writes the queued heads in batches, coalesced per run."""

    RETRY_S = (0.05, 0.2, 1.0, 5.0)
    IDLE_S = 30.0
    """The writer thread ends after this long with nothing to write (and gives back the backend's
    descriptor or connections); the next note starts it again."""

    def __init__(self, backend: AnchorBackend):
        self.backend = backend
        self._setup()
        os.register_at_fork(after_in_child=self._setup)  # a forked worker starts its own thread
        atexit.register(self.close)

    @property
    def where(self) -> str:
        return self.backend.where

    def _setup(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[str, Mark] = {}
        self._noted = self._done = 0
        self._failing = False
        self._thread: threading.Thread | None = None
        self._closing = False

    def note(self, run_id: str, seq: int, hash_: str) -> None:
        with self._cond:
            held = self._pending.get(run_id)
            if held is None or seq > held.seq:
                self._pending[run_id] = Mark(seq, hash_)
            self._noted += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="record-anchor", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every head noted so far is durable in the anchor; False on timeout, and at
        once while the writer's last try failed (a check then reads what the anchor holds)."""
        with self._cond:
            target = self._noted
            return self._cond.wait_for(lambda: self._done >= target or self._failing, timeout_s) and not self._failing

    def read(self, run_id: str) -> list[Mark]:
        return self.backend.read(run_id)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (waiting up to ``timeout_s``), then stop the thread."""
        self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing, self.IDLE_S)
                if not self._pending:
                    self._thread = None
                    idle = not self._closing
                    break
                batch, self._pending, upto = self._pending, {}, self._noted
            try:
                behind = self.backend.advance(batch)
            except Exception as err:  # noqa: BLE001 - the anchor is retried, never lost quietly
                failures += 1
                log.warning("record anchor (%s) not written (try %d), retrying: %s: %s", self.backend.where,
                            failures, type(err).__name__, err)
                with self._cond:
                    self._failing = True
                    self._cond.notify_all()
                    for run_id, mark in batch.items():
                        held = self._pending.get(run_id)
                        if held is None or mark.seq > held.seq:
                            self._pending[run_id] = mark
                    if self._closing:
                        self._thread = None
                        return
                time.sleep(self.RETRY_S[min(failures, len(self.RETRY_S)) - 1])
                continue
            failures = 0
            for run_id in behind:
                log.warning("the record chain of run %s is behind its anchor (%s): it was rolled back in the store",
                            run_id, self.backend.where)
            with self._cond:
                self._done, self._failing = upto, False
                self._cond.notify_all()
        if idle:
            with self._cond, contextlib.suppress(Exception):
                if self._thread is None:  # no note started another writer meanwhile
                    self.backend.release()


# -- which anchor, and the commit hook --------------------------------------------------------------

_ANCHORS: dict[tuple[str, ...], RecordAnchor] = {}
_ANCHORS_LOCK = threading.Lock()


def anchor_for(settings: GymSettings, secret: str, anchor_settings: RecordAnchorSettings | None = None,
               redis_settings: RedisSettings | None = None) -> RecordAnchor:
    """This process's anchor for a gym (one per file or Redis namespace, shared by every store and
    log of the process): Redis when ``RSIGYM_REDIS_URL`` is set, else the data dir's file, unless
    ``RSIGYM_RECORD_ANCHOR_KIND`` says which."""
    conf = anchor_settings or RecordAnchorSettings()
    url = conf.redis_url or (redis_settings or RedisSettings()).url
    kind = conf.kind if conf.kind != "auto" else ("redis" if url else "file")
    if kind == "redis":
        if not url:
            raise ValueError("RSIGYM_RECORD_ANCHOR_KIND=redis needs RSIGYM_REDIS_URL (or RSIGYM_RECORD_ANCHOR_REDIS_URL)")
        namespace = conf.namespace or seal(secret.encode(), "namespace")[:16]
        ident: tuple[str, ...] = ("redis", url, conf.key_prefix, namespace, secret)
    else:
        path = Path(conf.path or Path(settings.data_dir) / FILE_NAME).resolve()
        ident = ("file", str(path), secret)
    with _ANCHORS_LOCK:
        found = _ANCHORS.get(ident)
        if found is None:
            backend: AnchorBackend = (
                RedisAnchor(ident[1], secret, namespace=ident[3], prefix=ident[2], timeout_s=conf.redis_timeout_s)
                if kind == "redis" else FileAnchor(Path(ident[1]), secret))
            found = _ANCHORS[ident] = RecordAnchor(backend)
        return found


def note_on_commit(session: Session, anchor: ChainAnchor, run_id: str, seq: int, hash_: str) -> None:
    """Hand the head to ``anchor`` when (and only if) the session's transaction commits."""
    session.info.setdefault(_PENDING, []).append((anchor, run_id, seq, hash_))


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    pending: list[tuple[ChainAnchor, str, int, str]] = session.info.pop(_PENDING, [])
    for anchor, run_id, seq, hash_ in pending:
        anchor.note(run_id, seq, hash_)


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)
