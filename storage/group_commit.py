"""Group commit: concurrent short store transactions share one transaction and one commit.

A ledger reservation is two or three one-row statements and a ``COMMIT``; the commit is most of
its cost (SQLite writes and checkpoints its WAL, PostgreSQL waits for ``fdatasync``, ~2.4 ms on
this project's CI disk). Callers that arrive while a commit is under way queue; the next leader
runs everything queued, each caller's work in order, in one transaction, and commits once. One
caller alone runs exactly as :meth:`Store.begin` would, with no waiting for company.

The contract for a unit of work (``fn(work)``):

* It either completes, or raises having written nothing that is still in effect. Exceptions
  that a unit raises *by design* after undoing its own writes (a refused reservation) are listed
  in ``clean``: the batch goes on, and the caller gets that exception.
* Any other exception aborts the batch: the transaction rolls back, the failed unit runs again
  alone (its caller gets that run's outcome, so a deadlock between two replicas' batches is
  retried once, as a fresh transaction), and the rest run again as a new batch. Nothing is
  committed twice: a rolled-back transaction had no effect.
* A failure of ``BEGIN`` or ``COMMIT`` reaches every caller of the batch whose work had
  succeeded, as the same error (503 ``store_unavailable``): the gym fails closed, and, as with a
  transaction of one, a commit whose answer was lost may still have happened (the reaper closes
  a reservation nobody settles).

Leadership passes, after each batch, to the oldest waiting caller, so nobody leads others'
batches for long, and a caller that waits longer than the store's pool timeout without its work
having started is refused (503) and its work is never run.

Callers on an event loop (:meth:`GroupCommit.run_async`, the gateway's reservations and
settlements) queue the same way without a worker thread each: their batches are led by the
store's one *writer* thread, which wakes when the oldest waiting caller is such a coroutine, and
each coroutine is woken on its own loop when its work is done and committed. A thousand
concurrent calls cost a thousand futures, not a thousand thread trips. A coroutine caller with no
company (no other caller's work queued, led or awaited) on a SQLite store runs its work itself,
on its loop's thread, when it can do so without waiting for another writer
(``Store.run_unwaiting``); else it queues as above. Callers, threads and
coroutines alike, are woken once their batch has committed: at once when nobody waits behind them,
else while the next batch commits (:meth:`GroupCommit._wake_committed`). A coroutine cancelled while its work waits
withdraws it; one cancelled after its work was taken gets no result, and the unit's ``orphaned``
hook (a reservation's: release it) runs on what it produced, so nothing stays held for a caller
that went away.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, TypeVar, cast

from kit.errors import KeptConnectionLost, StoreUnavailable, WouldWait

T = TypeVar("T")
log = logging.getLogger("rsigym.store")


class Transaction(Protocol):
    """What a batch needs of one transaction: the store's ``Work`` (storage/store.py)."""

    @property
    def pipelines(self) -> bool: ...

    def pipeline(self) -> AbstractContextManager[Sequence[Any]]:
        """Statements sent inside go out without waiting; yields them (each with ``answered``)."""
        ...


W = TypeVar("W", bound=Transaction)
W_co = TypeVar("W_co", bound=Transaction, covariant=True)


class Transactions(Protocol[W_co]):
    """The store a :class:`GroupCommit` batches for (:class:`storage.store.Store`): it opens the
    transactions and owns the writer thread's kept connection; this module only orders callers."""

    def in_transaction(self) -> bool: ...

    def begin(self) -> AbstractContextManager[W_co]: ...

    def run_unwaiting(self, fn: Callable[[W_co], T]) -> T: ...

    def keeping_connection(self) -> AbstractContextManager[None]: ...

    def release_kept(self) -> None: ...

WRITER_IDLE_S = 5.0
"""The writer thread leaves after this long with nothing to lead (a new one starts when needed)."""
KEEP_IDLE_S = 1.0
"""The writer thread gives its kept connection back to the pool after this long without a batch."""
SWEEP_GRAIN_S = 0.05
"""A coroutine caller whose wait is over is refused within this much after it (see :meth:`GroupCommit._sweep`)."""

class Pipelined(Generic[T]):
    """A unit of work in two halves, so that a batch on PostgreSQL can send every unit's first
    statement before reading any answer (pipeline mode: one round trip for a run of such units,
    where each statement cost one, ~120-220 µs here).

    ``send(work)`` sends the unit's first statement (:meth:`Work.send`) and nothing else, and
    returns ``finish()``, which reads that answer and completes the unit (it may run further
    statements, one at a time). Called as a plain unit, ``fn(work)``, the halves run back to back:
    the same unit serves every store and every caller."""

    __slots__ = ("send",)

    def __init__(self, send: Callable[[Any], Callable[[], T]]):
        self.send = send

    def __call__(self, work: Any) -> T:
        return self.send(work)()


_NO_EVENT = threading.Event()
"""A coroutine caller's ``wake``: never waited on (its future is)."""


class _Unit(Generic[T]):
    __slots__ = ("fn", "clean", "taken", "lead", "result", "error", "wake", "loop", "future", "orphaned",
                 "resolved", "deadline")

    def __init__(self, fn: Callable[[Any], T], clean: tuple[type[BaseException], ...],
                 loop: asyncio.AbstractEventLoop | None = None):
        self.fn, self.clean = fn, clean
        self.taken = False
        """Set (under the queue lock) when a leader took the unit into a batch."""
        self.lead = False
        """Set (under the queue lock) when leadership passes to this unit's caller (threads only)."""
        self.result: T | None = None
        self.error: BaseException | None = None
        self.wake = threading.Event() if loop is None else _NO_EVENT
        """Set when a thread caller's work is done or the lead passes to it (threads only)."""
        self.loop = loop
        """The caller's event loop (:meth:`GroupCommit.run_async`); None for a thread caller."""
        self.future: asyncio.Future[None] | None = loop.create_future() if loop is not None else None
        self.orphaned: Callable[[T], None] | None = None
        """Set (on the caller's loop) when the coroutine was cancelled after its work was taken:
        undo the work once it is done (see :meth:`GroupCommit.run_async`)."""
        self.deadline = 0.0
        """When a coroutine caller's wait is over (its loop's clock), unless its work was taken."""
        self.resolved = False
        """Set on the caller's loop when the work's end reached it (:func:`_resolve`): the
        loop's order of the two, not the future's state, tells whether the work is done."""

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


def _wake(batch: list[_Unit[Any]]) -> None:
    """Wake the callers of a batch: their work is done. Thread callers by their event; coroutines
    by one hand-over per event loop for all of its callers in the batch (each hand-over to a loop
    from another thread writes to its wake-up socket: one per unit was a fifth of the writer's time
    at 64 concurrent callers)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Unit[Any]]] = {}
    for unit in batch:
        if unit.loop is None:
            unit.wake.set()
        else:
            by_loop.setdefault(unit.loop, []).append(unit)
    for loop, units in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, units)
        except RuntimeError:  # the callers' loop has closed: nobody is waiting
            pass


def _resolve(units: list[_Unit[Any]]) -> None:
    """On the callers' loop: each caller's work is done."""
    for unit in units:
        assert unit.future is not None
        unit.resolved = True
        if not unit.future.done():
            unit.future.set_result(None)
        elif unit.orphaned is not None:  # its caller was cancelled meanwhile
            GroupCommit._orphan(unit, unit.orphaned)


class _Abort(Exception):
    """A unit of a batch raised an unclean exception: roll the batch back."""

    def __init__(self, unit: _Unit[Any]):
        self.unit = unit


class GroupCommit(Generic[W]):
    """One per store (``W``: its transaction type); see the module docstring."""

    def __init__(self, store: Transactions[W], *, max_batch: int, wait_s: float, inline: bool = False):
        self._store = store
        self.max_batch = max(1, max_batch)
        self.wait_s = wait_s
        self.inline = inline
        """Whether a coroutine caller with no company runs its work itself, on its event loop's
        thread, when that cannot block (:meth:`run_async`): a SQLite store whose commits never
        checkpoint (the store's checkpointer thread does)."""
        self._awaiting = 0
        """Coroutine callers whose work is queued or taken and who have not resumed yet."""
        self.inline_units = 0
        """Units a coroutine caller ran itself (:meth:`run_async`): a figure for benches and tests."""
        self._lock = threading.Lock()
        self._queue: collections.deque[_Unit[Any]] = collections.deque()
        self._leading = False
        self._writer_turn = threading.Event()
        """Set when the lead passes to the writer thread (the oldest waiting caller is a coroutine)."""
        self._writer: threading.Thread | None = None
        self._handed = False
        """Set (under the queue lock) when the lead passes to the writer thread, cleared when it takes it."""
        self._closing = False
        """Set by :meth:`close`: the writer thread leaves as soon as it holds no lead."""
        self._committed: list[_Unit[Any]] = []
        """The callers of the last batch, done and committed, not yet woken (:meth:`_wake_committed`)."""
        self._watches: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}
        """Per event loop with callers waiting: the timer of its next :meth:`_sweep`."""
        self.batches = 0
        """Batches committed (of more than one unit): a figure for benches and tests."""
        self.units = 0

    def run(self, fn: Callable[[W], T], clean: tuple[type[BaseException], ...] = ()) -> T:
        if self._store.in_transaction():
            # This thread already holds a transaction on this store (and, on SQLite, the
            # writer's turn): waiting for a leader that needs what it holds would never end.
            with self._store.begin() as work:
                return fn(work)
        unit: _Unit[T] = _Unit(fn, clean)
        with self._lock:
            self._queue.append(unit)
            leads = not self._leading
            self._leading = True
        if not leads and not self._await(unit):
            return unit.outcome()
        self._lead()
        return unit.outcome()

    async def run_async(self, fn: Callable[[W], T], clean: tuple[type[BaseException], ...] = (),
                        orphaned: Callable[[T], None] | None = None) -> T:
        """:meth:`run` for a caller on an event loop: no worker thread of its own (see the module
        docstring). ``orphaned(result)`` runs, on a thread of its own, when this coroutine was
        cancelled after its work had been taken and the work then succeeded."""
        if self._store.in_transaction():  # as in run(): a leader would wait for what this thread holds
            with self._store.begin() as work:
                return fn(work)
        with self._lock:
            self._awaiting += 1
            alone = self._awaiting == 1
        try:
            if alone and self.inline:
                # Callers made ready together with this one (a burst) arrive first, and queue.
                await asyncio.sleep(0)
                if self._awaiting == 1 and not self._leading and not self._queue:
                    # Nobody else's store work is in flight: a batch would be this unit alone,
                    # and handing it to the writer thread and back (two thread wake-ups, 100-300
                    # µs on 2 cores) costs more than the work. Run it here, unless that means
                    # waiting for another writer.
                    self.inline_units += 1
                    try:
                        return self._store.run_unwaiting(fn)
                    except WouldWait:
                        self.inline_units -= 1  # another writer is at work (nothing ran): queue, as with company
            return await self._queued(fn, clean, orphaned)
        finally:
            with self._lock:
                self._awaiting -= 1

    async def _queued(self, fn: Callable[[W], T], clean: tuple[type[BaseException], ...],
                      orphaned: Callable[[T], None] | None) -> T:
        """:meth:`run_async`'s work queued for a batch that the writer thread leads."""
        unit: _Unit[T] = _Unit(fn, clean, asyncio.get_running_loop())
        assert unit.future is not None
        with self._lock:
            self._queue.append(unit)
            starts = not self._leading
            self._leading = True
        if starts:
            self._hand_to_writer()
        self._watch(unit)
        try:
            await unit.future
        except asyncio.CancelledError:
            # Cancelling this task cancelled the unit's future too, unless its work was done.
            with self._lock:
                withdrawn = not unit.taken
                if withdrawn:
                    self._queue.remove(unit)
            if not withdrawn and orphaned is not None:
                # Both this and _resolve run on this loop, so exactly one of them undoes the work:
                # _resolve, if the work's end has not reached the loop yet; else here, now. (The
                # future alone cannot tell: cancelling the task cancels it either way when the
                # cancellation reached the loop before the work's end did.)
                if unit.resolved:
                    self._orphan(unit, orphaned)
                else:
                    unit.orphaned = orphaned
            raise
        return unit.outcome()

    def _watch(self, unit: _Unit[Any]) -> None:
        """On the caller's loop: make sure a watch will refuse ``unit`` once it has waited
        ``wait_s`` without its work starting. One timer per event loop, not one per call: a
        call's own timer (its heap entry, its cancellation, the heap's Python comparisons) was
        ~5 % of a reservation's CPU at 64 concurrent callers."""
        loop = unit.loop
        assert loop is not None
        unit.deadline = loop.time() + self.wait_s
        if loop not in self._watches:
            with self._lock:
                for gone in [other for other in self._watches if other.is_closed()]:
                    del self._watches[gone]
                self._watches[loop] = loop.call_at(unit.deadline, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``, at the oldest deadline it was armed for: refuse each of its callers whose
        wait is over and whose work has not started (a unit taken just as its wait ran out waits
        on), and arm again for the next deadline, if any of its callers still waits."""
        now = loop.time()
        expired: list[_Unit[Any]] = []
        later: float | None = None
        with self._lock:
            del self._watches[loop]
            for unit in self._queue:
                # A unit whose future is done was cancelled: its coroutine withdraws it itself.
                if unit.loop is not loop or unit.future is None or unit.future.done():
                    continue
                if unit.deadline <= now:
                    expired.append(unit)
                elif later is None or unit.deadline < later:
                    later = unit.deadline
            if expired:
                gone = {id(unit) for unit in expired}
                waiting = [unit for unit in self._queue if id(unit) not in gone]
                self._queue.clear()
                self._queue.extend(waiting)
            if later is not None:
                # Not sooner than SWEEP_GRAIN_S from now: under a backlog, one sweep a grain, not one a caller.
                self._watches[loop] = loop.call_at(max(later, now + SWEEP_GRAIN_S), self._sweep, loop)
        for unit in expired:
            assert unit.future is not None
            unit.future.set_exception(StoreUnavailable("the gym's store is busy; the call was refused"))

    @staticmethod
    def _orphan(unit: _Unit[T], orphaned: Callable[[T], None]) -> None:
        """The work of a cancelled caller is done: undo what it produced, off the event loop."""
        if unit.error is None:
            threading.Thread(target=GroupCommit._undo, args=(orphaned, unit.result), daemon=True,
                             name="rsigym-orphaned-unit").start()

    @staticmethod
    def _undo(orphaned: Callable[[T], None], result: T) -> None:
        try:
            orphaned(result)
        except Exception:  # noqa: BLE001 - logged; the reaper is the backstop
            log.exception("could not undo the work of a cancelled store call")

    def _hand_to_writer(self) -> None:
        """Give the lead to the writer thread, starting one if none is waiting. Under the queue
        lock, so a writer that is just leaving (idle) either sees its turn or is replaced."""
        with self._lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="rsigym-store-writer", daemon=True)
                self._writer.start()
            self._handed = True
            self._writer_turn.set()

    def close(self, timeout_s: float = 5.0) -> None:
        """The store is being disposed of: the writer thread leads what it was handed, gives its
        kept connection back and ends (waited for at most ``timeout_s``). A caller after this
        still gets a writer, which leaves again once it has led that caller's batch."""
        with self._lock:
            self._closing = True
            writer = self._writer
        self._writer_turn.set()
        if writer is not None and writer is not threading.current_thread():
            writer.join(timeout_s)

    def _write(self) -> None:
        """The writer thread: leads whenever handed the lead; leaves after WRITER_IDLE_S without,
        or once closed (:meth:`close`). Its batches share one pooled connection while it lives
        (:meth:`Store.keeping_connection`)."""
        with self._store.keeping_connection():
            while True:
                with self._lock:
                    if self._closing and not self._handed:
                        self._writer = None
                        return
                if not self._writer_turn.wait(KEEP_IDLE_S):
                    self._store.release_kept()  # idle: the connection goes back (to be tested when taken again)
                    if not self._writer_turn.wait(WRITER_IDLE_S - KEEP_IDLE_S):
                        with self._lock:
                            if not self._writer_turn.is_set():
                                self._writer = None
                                return
                        continue
                self._writer_turn.clear()
                with self._lock:
                    handed, self._handed = self._handed, False
                if handed:  # else woken by close()
                    self._lead()

    def _await(self, unit: _Unit[Any]) -> bool:
        """Wait until the unit is done (False) or this caller is to lead (True)."""
        if not unit.wake.wait(self.wait_s):
            with self._lock:
                if not unit.taken and not unit.lead:
                    self._queue.remove(unit)
                    raise StoreUnavailable("the gym's store is busy; the call was refused")
            unit.wake.wait()  # started (or handed the lead) just as the wait ran out
        return unit.lead

    def _lead(self) -> None:
        with self._lock:
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            for unit in batch:
                unit.taken = True
        try:
            self._execute(batch)
        finally:
            self._wake_committed()  # the batch before, if this one never reached its commit
            with self._lock:
                successor = self._queue[0] if self._queue else None
                if successor is not None and successor.loop is None:
                    successor.lead = True
                elif successor is None:
                    self._leading = False
                if successor is not None:
                    # More work waits: this batch's callers are woken while the next batch
                    # commits (see _wake_committed), not now.
                    self._committed.extend(batch)
                    batch = []
            _wake(batch)
            if successor is not None:
                if successor.loop is None:
                    successor.wake.set()
                else:
                    self._hand_to_writer()

    def _wake_committed(self) -> None:
        """Wake the callers of the batch led before this one (done and committed), if not yet.

        Called by a batch right before its own ``COMMIT``, when a backlog keeps the writer busy:
        the commit runs in SQLite / libpq with the GIL released, so the callers' event loop can
        take up their results meanwhile instead of stalling the writer at each short statement
        of the next batch (each statement gives up the GIL and must wait to get it back; at 1,000
        calls in flight the writer spent a fifth of its time so). A caller's wake comes at most
        one batch's statements later; with no backlog, a batch's callers are woken at once."""
        with self._lock:
            committed, self._committed = self._committed, []
        if committed:
            _wake(committed)

    def _execute(self, batch: list[_Unit[Any]]) -> None:
        while batch:
            if len(batch) == 1:
                self._alone(batch[0])
                return
            failed = self._together(batch)
            if failed is None:
                return
            self._alone(failed)
            batch = [u for u in batch if u is not failed]

    def _together(self, batch: list[_Unit[Any]]) -> _Unit[Any] | None:
        """Run the batch in one transaction; the unit that aborted it, if one did."""
        for unit in batch:
            unit.result, unit.error = None, None
        try:
            with self._store.begin() as work:
                i = 0
                while i < len(batch):
                    j = i
                    while work.pipelines and j < len(batch) and isinstance(batch[j].fn, Pipelined):
                        j += 1
                    if j - i > 1:
                        self._pipelined(work, batch[i:j])
                        i = j
                        continue
                    unit = batch[i]
                    i += 1
                    try:
                        unit.result = unit.fn(work)
                    except unit.clean as err:
                        unit.error = err
                    except BaseException as err:
                        raise _Abort(unit) from err
                self._wake_committed()  # right before this batch's COMMIT (leaving the block)
        except _Abort as abort:
            return abort.unit
        except BaseException as err:  # noqa: BLE001 - BEGIN, COMMIT or the writer's turn: each caller gets it
            for unit in batch:
                if unit.error is None:
                    unit.result, unit.error = None, err
            return None
        self.batches += 1
        self.units += len(batch)
        return None

    @staticmethod
    def _pipelined(work: Transaction, units: list[_Unit[Any]]) -> None:
        """Run a run of :class:`Pipelined` units: every first statement sent in one pipeline,
        then each unit finished in order. A failure aborts the batch in the name of the unit
        whose statement the server did not answer (the one that failed: the pipeline stops
        there), which then runs alone, as any unit that fails a batch."""
        finishes: list[Callable[[], Any]] = []
        sent: Sequence[Any] = []
        sending = units[0]
        try:
            with work.pipeline() as sent:
                for sending in units:
                    finishes.append(cast(Pipelined[Any], sending.fn).send(work))
        except BaseException as err:
            # One statement a unit, in order: the first unanswered is the failed unit's.
            unanswered = (unit for unit, statement in zip(units, sent, strict=False) if not statement.answered)
            raise _Abort(next(unanswered, sending)) from err
        for unit, finish in zip(units, finishes, strict=True):
            try:
                unit.result = finish()
            except unit.clean as err:
                unit.error = err
            except BaseException as err:
                raise _Abort(unit) from err

    def _alone(self, unit: _Unit[Any]) -> None:
        for again in (True, False):
            unit.result, unit.error = None, None
            try:
                with self._store.begin() as work:
                    unit.result = unit.fn(work)
            except KeptConnectionLost as err:
                # The writer's kept connection was dropped by the server while it sat between
                # batches; nothing was written: once more, on a fresh (tested) connection. (In a
                # batch the same failure aborts it, and its units run again alone.)
                unit.result, unit.error = None, err
                if again:
                    continue
            except BaseException as err:  # noqa: BLE001 - the unit's own outcome, raised in its caller's thread
                unit.result, unit.error = None, err
            return
