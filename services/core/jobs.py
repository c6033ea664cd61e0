"""One lifecycle for long jobs (training, evaluation), whoever runs them.

A job row is claimed by exactly one worker with one atomic ``UPDATE … WHERE status = 'queued'``;
the worker renews the row's ``heartbeat_at`` while the job runs and finishes it once (a final
state is never overwritten, and only the claiming worker may finish a running job). A job whose
heartbeat is older than ``heartbeat_ttl_s`` belongs to a worker that died (``kill -9``, a lost
node): :meth:`JobRunnerBase.reap_stale` fails it — or puts it back in the queue when its kind
can resume — and releases the ledger holds it left (``ref_id`` = job id, still ``reserved``).

Where the work runs is the dispatcher's business: embedded mode keeps an in-process thread pool
(:class:`services.core.workers.JobPool`); distributed mode sends a Celery task to the job's
queue (services/worker/). The same :meth:`JobRunnerBase.execute` runs in both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, timedelta
from typing import Any, ClassVar, Protocol, cast

from sqlalchemy import CursorResult, func, or_, select, update
from sqlalchemy.orm import Session

from services.core.errors import GymError
from services.core.ledger import Ledger
from services.core.settings import JobSettings
from services.core.store import Store
from services.core.tables import LedgerEntry, utcnow
from services.core.workers import JobPool

log = logging.getLogger("rsigym.jobs")

QUEUES = ("training", "training-gpu", "evaluation")
"""The per-role queues; a worker consumes some of them (``rsigym worker --queues …``)."""
OPEN = ("queued", "running")


class Dispatcher(Protocol):
    """Gets a queued job to some worker. Sending a job twice is harmless (claims are atomic)."""

    def dispatch(self, runner: JobRunnerBase, job_id: str, queue: str, task: str) -> None: ...

    def shutdown(self) -> None: ...


class PoolDispatcher:
    """Embedded mode: the job runs on a thread of this process."""

    def __init__(self, workers: int, name: str):
        self.pool = JobPool(workers, name)

    def dispatch(self, runner: JobRunnerBase, job_id: str, queue: str, task: str) -> None:
        self.pool.submit(runner.task_body(task), job_id)

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self.pool.wait_idle(timeout)

    def shutdown(self) -> None:
        self.pool.shutdown()


def default_dispatcher(settings: JobSettings, workers: int, name: str) -> Dispatcher:
    if settings.backend == "celery":
        from services.worker.celery_app import CeleryDispatcher

        return CeleryDispatcher()
    return PoolDispatcher(workers, name)


def worker_identity() -> str:
    """host:pid:random — unique per runner, readable in a job row."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class JobRunnerBase:
    """Subclasses set ``table`` (an ORM class with the job columns: id, status, queue, worker,
    heartbeat_at, claims, cancel_requested, error, started_at, finished_at), ``kind``, ``final``
    and ``resumable``, and implement :meth:`_run` (the work of one claimed job)."""

    table: ClassVar[Any]
    kind: ClassVar[str]
    final: ClassVar[frozenset[str]]
    resumable: ClassVar[bool] = False
    """A job of this kind whose worker died is re-queued (its progress is in the store) rather than failed."""

    def __init__(self, store: Store, *, workers: int, name: str, settings: JobSettings | None = None,
                 dispatcher: Dispatcher | None = None):
        self.store = store
        self.job_settings = settings or JobSettings()
        self.dispatcher = dispatcher or default_dispatcher(self.job_settings, workers, name)
        self.worker_id = worker_identity()
        self.ledger = Ledger(store)
        self._reaper: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- routing (overridable) ------------------------------------------------------------

    def task_name(self, job: Any) -> str:
        return f"rsigym.{self.kind}.run"

    def extra_tasks(self, job: Any) -> list[str]:
        """More tasks sent with a job (evaluation: helpers that share its trials)."""
        return []

    def task_body(self, task: str) -> Callable[[str], bool]:
        """What a task of this name runs in a worker."""
        return self.execute

    # -- submitting -----------------------------------------------------------------------

    def submit(self, job_id: str) -> None:
        with self.store.transaction() as s:
            job = s.get(self.table, job_id)
            if job is None or job.status != "queued":
                return
            queue, tasks = job.queue, [self.task_name(job), *self.extra_tasks(job)]
        for task in tasks:
            self.dispatcher.dispatch(self, job_id, queue, task)

    def recover(self) -> None:
        """At start: jobs whose worker is gone are reaped, queued ones are (re)sent.

        Embedded, this process was the only worker, so every running job died with it. With
        Celery, other workers may be running jobs right now: only stale heartbeats are reaped,
        and workers reap on their own as well (:meth:`start_reaper`)."""
        if isinstance(self.dispatcher, PoolDispatcher):
            self.reap_stale(ttl_s=0, reason="the gym restarted during this job")
        else:
            self.reap_stale()
            self.start_reaper()
        with self.store.transaction() as s:
            queued = s.scalars(select(self.table.id).where(self.table.status == "queued")
                               .order_by(self.table.created_at)).all()
        for job_id in queued:
            try:
                self.submit(job_id)
            except GymError as err:  # the broker is down: the job stays queued for the next start
                log.warning("%s job %s not re-sent: %s", self.kind, job_id, err.message)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Embedded: wait until the pool has run everything it was given."""
        wait = getattr(self.dispatcher, "wait_idle", None)
        return True if wait is None else bool(wait(timeout))

    def shutdown(self) -> None:
        self._stopping.set()
        self.dispatcher.shutdown()

    # -- running (the body of a worker's task) ---------------------------------------------

    def execute(self, job_id: str) -> bool:
        """Claim and run one job; False when there was nothing to do (idempotent: a job that
        is final, cancelled or running elsewhere with a fresh heartbeat is left alone)."""
        job = self.claim(job_id)
        if job is None:
            return False
        with self._heartbeat(job_id):
            try:
                self._run(job)
            except Exception as err:  # noqa: BLE001 - a job ends in a final state whatever happens
                log.exception("%s job %s crashed", self.kind, job_id)
                self._finish(job_id, "failed", self.describe_error(err))
        if self._still_mine(job_id):  # _run returned without a final state: that is a bug, not a success
            self._finish(job_id, "failed", "internal error: the job ended without a result")
        return True

    def claim(self, job_id: str) -> Any | None:
        """Atomically take a queued job for this worker; None if someone else has it."""
        t = self.table
        now = utcnow()
        for _ in range(2):
            with self.store.transaction() as s:
                taken = _updated(s, update(t).where(t.id == job_id, t.status == "queued", t.cancel_requested.is_(False))
                                 .values(status="running", worker=self.worker_id, heartbeat_at=now, claims=t.claims + 1,
                                         started_at=func.coalesce(t.started_at, now)))
                job = s.get(t, job_id, populate_existing=True)
                if job is None:
                    return None
                if taken == 1:
                    s.expunge(job)
                    return job
                status, cancel, heartbeat = job.status, job.cancel_requested, job.heartbeat_at
            if status == "queued" and cancel:
                self._finish(job_id, "cancelled", None)
                return None
            if status == "running" and (heartbeat is None or heartbeat < utcnow() - self._ttl()):
                # A redelivered task for a job whose worker died: reap it, then take it if it was re-queued.
                self.reap_stale(only=job_id)
                continue
            return None
        return None

    def _run(self, job: Any) -> None:
        raise NotImplementedError

    def describe_error(self, err: Exception) -> str:
        return f"internal error: {type(err).__name__}"

    @contextlib.contextmanager
    def _heartbeat(self, job_id: str, *, own_job: bool = True) -> Iterator[None]:
        """Beat while the block runs: the job row (when this worker holds it) and :meth:`_beat`'s rows."""
        stop = threading.Event()
        t = self.table

        def beat() -> None:
            while not stop.wait(self.job_settings.heartbeat_interval_s):
                try:
                    with self.store.transaction() as s:
                        if own_job:
                            s.execute(update(t).where(t.id == job_id, t.worker == self.worker_id, t.status == "running")
                                      .values(heartbeat_at=utcnow()).execution_options(synchronize_session=False))
                        self._beat(s, job_id)
                except Exception as err:  # noqa: BLE001 - a missed beat is retried; a long outage gets the job reaped
                    log.warning("%s job %s: heartbeat failed: %s", self.kind, job_id, type(err).__name__)

        thread = threading.Thread(target=beat, name=f"rsigym-heartbeat-{job_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)

    def _beat(self, session: Session, job_id: str) -> None:
        """Hook: renew this worker's other leases of the job (evaluation: its trial claims)."""

    def _still_mine(self, job_id: str) -> bool:
        t = self.table
        with self.store.transaction() as s:
            return s.scalar(select(func.count()).select_from(t).where(
                t.id == job_id, t.status == "running", t.worker == self.worker_id)) == 1

    def should_stop(self, job_id: str) -> bool:
        """Cancel requested, or the job is no longer this worker's (reaped while it stalled)."""
        t = self.table
        with self.store.transaction() as s:
            row = s.execute(select(t.cancel_requested, t.status, t.worker).where(t.id == job_id)).first()
        return row is None or bool(row[0]) or row[1] != "running" or row[2] != self.worker_id

    # -- finishing (once) -------------------------------------------------------------------

    def _finish(self, job_id: str, status: str, error: str | None) -> bool:
        """Put the job in a final state, once: a queued job, or a running one this worker holds.
        Returns False when it was already final (or reaped, or taken over by another worker)."""
        t = self.table
        with self.store.transaction() as s:
            done = _updated(s, update(t).where(
                t.id == job_id, or_(t.status == "queued", (t.status == "running") & (t.worker == self.worker_id)))
                .values(status=status, error=error, finished_at=utcnow()))
            if done != 1:
                return False
            self._on_final(s, job_id, status)
        self._after_final(job_id, status, error)
        return True

    def _on_final(self, session: Session, job_id: str, status: str) -> None:
        """Hook: more writes in the finishing transaction (a score, a score row)."""

    def _after_final(self, job_id: str, status: str, error: str | None) -> None:
        """Hook: work after the final state is committed (logs, validation bookkeeping)."""

    # -- reaping -----------------------------------------------------------------------------

    def _ttl(self) -> timedelta:
        return timedelta(seconds=self.job_settings.heartbeat_ttl_s)

    def reap_stale(self, *, ttl_s: float | None = None, only: str | None = None,
                   reason: str = "its worker stopped (no heartbeat)") -> int:
        """Fail — or re-queue, for a resumable kind within ``max_resumes`` — every running job
        whose heartbeat is older than the TTL, and release the ledger holds it left behind.
        Each job is taken by one atomic UPDATE, so several reapers never act on a job twice."""
        t = self.table
        cutoff = utcnow() - (timedelta(seconds=ttl_s) if ttl_s is not None else self._ttl())
        stale = (t.status == "running") & (t.heartbeat_at.is_(None) | (t.heartbeat_at < cutoff))
        with self.store.transaction() as s:
            q = select(t.id, t.claims).where(stale)
            rows = s.execute(q.where(t.id == only) if only else q).all()
        reaped = 0
        for job_id, claims in rows:
            resume = self.resumable and (claims or 0) <= self.job_settings.max_resumes
            with self.store.transaction() as s:
                values: dict[str, Any] = (
                    {"status": "queued", "worker": None, "heartbeat_at": None} if resume
                    else {"status": "failed", "error": reason, "finished_at": utcnow()})
                if _updated(s, update(t).where(t.id == job_id, stale).values(**values)) != 1:
                    continue
                if not resume:
                    self._on_final(s, job_id, "failed")
            reaped += 1
            released = self.release_holds(job_id)
            log.warning("%s job %s: %s; %s (%d ledger holds released)", self.kind, job_id, reason,
                        "re-queued" if resume else "failed", released)
            self._after_reaped(job_id)
            if resume:
                try:
                    self.submit(job_id)
                except GymError as err:
                    log.warning("%s job %s re-queued but not re-sent: %s", self.kind, job_id, err.message)
            else:
                self._after_final(job_id, "failed", reason)
        return reaped

    def release_holds(self, job_id: str) -> int:
        """Release reservations the job still holds (a dead worker's step that never settled)."""
        with self.store.transaction() as s:
            held = s.scalars(select(LedgerEntry.id).where(LedgerEntry.ref_id == job_id,
                                                          LedgerEntry.status == "reserved")).all()
        for reservation_id in held:
            self.ledger.release(reservation_id)
        return len(held)

    def _after_reaped(self, job_id: str) -> None:
        """Hook: clean up what a dead worker left (minted keys, …)."""

    def start_reaper(self) -> None:
        """Reap stale jobs every ``reap_interval_s`` on a daemon thread (distributed mode)."""
        if self._reaper is not None:
            return

        def loop() -> None:
            while not self._stopping.wait(self.job_settings.reap_interval_s):
                try:
                    self.reap_stale()
                except Exception as err:  # noqa: BLE001 - the reaper lives on; the next round retries
                    log.warning("%s reaper skipped a round: %s", self.kind, type(err).__name__)

        self._reaper = threading.Thread(target=loop, name=f"rsigym-{self.kind}-reaper", daemon=True)
        self._reaper.start()


# -- queue figures (metrics) --------------------------------------------------------------------

def queue_figures(store: Store, tables: list[Any]) -> dict[str, tuple[int, float]]:
    """queue → (jobs waiting, age in seconds of the oldest waiting one), every known queue listed."""
    figures: dict[str, tuple[int, float]] = {q: (0, 0.0) for q in QUEUES}
    now = utcnow()
    with store.transaction() as s:
        for t in tables:
            for queue, depth, oldest in s.execute(
                    select(t.queue, func.count(), func.min(t.created_at)).where(t.status == "queued").group_by(t.queue)):
                old_depth, old_age = figures.get(queue, (0, 0.0))
                age = max(0.0, (now - _aware(oldest)).total_seconds()) if oldest is not None else 0.0
                figures[queue] = (old_depth + depth, max(old_age, age))
    return figures


def finished_counts(store: Store, tables: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(kind, final status) → jobs that ended so. Job rows are never deleted, so this is a counter
    that every finisher (any worker, any reaper) has counted by writing its row."""
    counts: dict[tuple[str, str], int] = {}
    with store.transaction() as s:
        for kind, t in tables.items():
            for status, n in s.execute(select(t.status, func.count()).where(t.status.not_in(OPEN)).group_by(t.status)):
                counts[(kind, status)] = n
    return counts


def _updated(session: Session, statement: Any) -> int:
    """Run an UPDATE; how many rows it changed."""
    result = session.execute(statement.execution_options(synchronize_session=False))
    return int(cast(CursorResult[Any], result).rowcount)


def _aware(value: Any) -> Any:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

