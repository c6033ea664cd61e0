"""The in-process worker pool that long jobs (training, evaluation) run on in embedded mode.

It counts what it has been given, so a test or a shutdown can wait until every job is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class JobPool:
    def __init__(self, workers: int, name: str):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._idle = threading.Condition()
        self._active = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a worker; ``fn`` must handle its own errors."""
        with self._idle:
            self._active += 1
        self._pool.submit(self._run, fn, *args)

    def _run(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
