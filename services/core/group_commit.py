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
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from services.core.errors import StoreUnavailable

if TYPE_CHECKING:
    from services.core.store import Store, Work

T = TypeVar("T")

class _Unit(Generic[T]):
    __slots__ = ("fn", "clean", "taken", "lead", "result", "error", "wake")

    def __init__(self, fn: Callable[[Work], T], clean: tuple[type[BaseException], ...]):
        self.fn, self.clean = fn, clean
        self.taken = False
        """Set (under the queue lock) when a leader took the unit into a batch."""
        self.lead = False
        """Set (under the queue lock) when leadership passes to this unit's caller."""
        self.result: T | None = None
        self.error: BaseException | None = None
        self.wake = threading.Event()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class _Abort(Exception):
    """A unit of a batch raised an unclean exception: roll the batch back."""

    def __init__(self, unit: _Unit[Any]):
        self.unit = unit


class GroupCommit:
    """One per :class:`Store`; see the module docstring."""

    def __init__(self, store: Store, *, max_batch: int, wait_s: float):
        self._store = store
        self.max_batch = max(1, max_batch)
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._queue: collections.deque[_Unit[Any]] = collections.deque()
        self._leading = False
        self.batches = 0
        """Batches committed (of more than one unit): a figure for benches and tests."""
        self.units = 0

    def run(self, fn: Callable[[Work], T], clean: tuple[type[BaseException], ...] = ()) -> T:
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
            with self._lock:
                successor = self._queue[0] if self._queue else None
                if successor is not None:
                    successor.lead = True
                else:
                    self._leading = False
            for unit in batch:
                unit.wake.set()
            if successor is not None:
                successor.wake.set()

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
                for unit in batch:
                    try:
                        unit.result = unit.fn(work)
                    except unit.clean as err:
                        unit.error = err
                    except BaseException as err:
                        raise _Abort(unit) from err
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

    def _alone(self, unit: _Unit[Any]) -> None:
        unit.result, unit.error = None, None
        try:
            with self._store.begin() as work:
                unit.result = unit.fn(work)
        except BaseException as err:  # noqa: BLE001 - the unit's own outcome, raised in its caller's thread
            unit.result, unit.error = None, err
