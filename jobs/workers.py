"""The in-process worker pool that long jobs (training, evaluation) run on in embedded mode.

It counts what it has been given, so a test or a shutdown can wait until every job is done, and
what it is running, so the job scheduler (jobs/lifecycle.py) hands it a job only when a
worker is free — jobs never wait in the pool's own first-come queue, where fairness across runs
could not apply.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("rsigym.jobs")


class JobPool:
    def __init__(self, workers: int, name: str):
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._idle = threading.Condition()
        self._active = 0
        """Given and not yet done, including the hand-over after each job (what wait_idle waits for)."""
        self._busy = 0
        """Workers taken (what free() counts)."""

    def free(self) -> int:
        with self._idle:
            return max(0, self.workers - self._busy)

    def submit(self, fn: Callable[..., Any], *args: Any, on_done: Callable[[], object] | None = None) -> None:
        """Run ``fn(*args)`` on a worker; ``fn`` must handle its own errors. ``on_done`` runs after
        ``fn`` once its worker counts as free again, before the pool may count as idle (so what it
        submits keeps :meth:`wait_idle` waiting)."""
        with self._idle:
            self._active += 1
            self._busy += 1
        try:
            self._pool.submit(self._run, fn, args, on_done)
        except RuntimeError:  # shut down
            self._done(busy=True)
            raise

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], on_done: Callable[[], object] | None) -> None:
        try:
            fn(*args)
        finally:
            with self._idle:
                self._busy -= 1
            try:
                if on_done is not None:
                    on_done()
            except Exception as err:  # noqa: BLE001 - the next job is started by the next event instead
                log.warning("after a job: %s", type(err).__name__)
            finally:
                self._done(busy=False)

    def _done(self, *, busy: bool) -> None:
        with self._idle:
            self._active -= 1
            if busy:
                self._busy -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
