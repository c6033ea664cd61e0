"""One lifecycle for long jobs (training, evaluation), whoever runs them.

A job row is claimed by exactly one worker with one atomic ``UPDATE … WHERE status = 'queued'``;
the worker renews the row's ``heartbeat_at`` while the job runs and finishes it once (a final
state is never overwritten, and only the claiming worker may finish a running job). A job whose
heartbeat is older than ``heartbeat_ttl_s`` belongs to a worker that died (``kill -9``, a lost
node): :meth:`JobRunnerBase.reap_stale` fails it — or puts it back in the queue when its kind
can resume (training from its last checkpoint, evaluation from its recorded trials), at most
``max_resumes`` times — and releases the ledger holds it left (``ref_id`` = job id, still
``reserved``: the step or trial the dead worker was in is not the agent's cost).

Where the work runs is the dispatcher's business: embedded mode keeps an in-process thread pool
(:class:`jobs.workers.JobPool`); distributed mode sends a Celery task to the job's
queue (services/worker/). The same :meth:`JobRunnerBase.execute` runs in both.

Queued jobs wait in the store, not in the pool or the broker: :meth:`JobRunnerBase.pump` hands
them out only when there is room — a free pool thread (embedded), or fewer than
``publish_ahead`` published-and-untaken tasks on the job's queue (Celery) — in fair order: the
run with the fewest running jobs first, then the run whose last job started longest ago
(round-robin), then the longest waiting job. A run never has more than ``max_running_per_run``
jobs running: the pump does not hand out a job beyond it, and :meth:`JobRunnerBase.claim`
refuses it atomically (whatever sent the task). The pump runs when a job is submitted, taken,
finished or reaped, and on every reaper round; a job's place in that order is its
``queue_position`` (:meth:`JobRunnerBase.queue_info`).
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol, cast

from sqlalchemy import CursorResult, func, or_, select, text, true, update
from sqlalchemy.orm import Session, aliased

from billing.ledger import Ledger
from jobs.workers import JobPool
from kit.backends import Registry
from kit.errors import GymError, storage_full
from kit.settings import JobSettings
from storage.store import Store
from storage.tables import OPEN_ROW, LedgerEntry, utcnow

log = logging.getLogger("rsigym.jobs")

QUEUES = ("training", "training-gpu", "evaluation")
"""The per-role queues; a worker consumes some of them (``rsigym worker --queues …``)."""
OPEN = ("queued", "running")


class Dispatcher(Protocol):
    """Gets a queued job to some worker. Sending a job twice is harmless (claims are atomic).

    A dispatcher that knows its workers has ``free() -> int`` (free workers for any of the
    runner's queues): the pump sends it no more than that. Without it (Celery: the workers are
    elsewhere) the pump keeps at most ``publish_ahead`` sent-and-untaken jobs per queue."""

    def dispatch(self, runner: JobRunnerBase, job_id: str, queue: str, task: str) -> None: ...

    def shutdown(self) -> None: ...


class PoolDispatcher:
    """Embedded mode: the job runs on a thread of this process; when it ends, the pump hands the
    freed thread the next job."""

    def __init__(self, workers: int, name: str):
        self.pool = JobPool(workers, name)

    def free(self) -> int:
        return self.pool.free()

    def dispatch(self, runner: JobRunnerBase, job_id: str, queue: str, task: str) -> None:
        self.pool.submit(runner.task_body(task), job_id, on_done=runner.pump_quietly)

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self.pool.wait_idle(timeout)

    def shutdown(self) -> None:
        self.pool.shutdown()


DispatcherFactory = Callable[[int, str], Dispatcher]
"""``(workers, name) -> Dispatcher``: a runner's dispatcher for its ``workers`` and thread name."""

DISPATCHERS: Registry[DispatcherFactory] = Registry("job dispatcher", lazy={"celery": "services.worker.celery_app"})
"""Dispatchers by ``RSIGYM_JOBS_BACKEND``; ``celery`` registers itself in services/worker/ (the kit
imports no service: the registry names the module)."""
DISPATCHERS.register("embedded")(PoolDispatcher)


def default_dispatcher(settings: JobSettings, workers: int, name: str) -> Dispatcher:
    return DISPATCHERS.get(settings.backend)(workers, name)


@dataclass
class _Waiting:
    id: str
    run_id: str
    queue: str
    since: datetime
    """In the queue since (queued_at, else created_at)."""
    dispatched: bool
    capped: bool
    """Counts against the run's cap (evaluation: agent jobs only)."""
    cancel: bool = False


def fair_order(waiting: list[_Waiting], load: dict[str, int], last_start: dict[str, float]) -> list[_Waiting]:
    """The order jobs get workers in: repeatedly the head (oldest) job of the run with the fewest
    jobs running or on their way, ties to the run whose last job started longest ago, then to the
    longest waiting head — round-robin across runs, first-come within a run."""
    by_run: dict[str, list[_Waiting]] = {}
    for job in sorted(waiting, key=lambda j: (j.since, j.id)):
        by_run.setdefault(job.run_id, []).append(job)
    heap = [(load.get(run, 0), last_start.get(run, float("-inf")), jobs[0].since.timestamp(), run)
            for run, jobs in by_run.items()]
    heapq.heapify(heap)
    heads = dict.fromkeys(by_run, 0)
    order: list[_Waiting] = []
    tick = max(last_start.values(), default=0.0)
    while heap:
        n, _, _, run = heapq.heappop(heap)
        jobs = by_run[run]
        job = jobs[heads[run]]
        order.append(job)
        heads[run] += 1
        tick += 1.0  # this run started last of all, for the next turn's ties
        if heads[run] < len(jobs):
            heapq.heappush(heap, (n + 1, tick, jobs[heads[run]].since.timestamp(), run))
    return order


def _lock_key(*parts: str) -> int:
    """A signed 64-bit key for pg_advisory_xact_lock."""
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:8], "big", signed=True)


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
                 dispatcher: Dispatcher | None = None, max_running_per_run: int | None = None):
        self.store = store
        self.job_settings = settings or JobSettings()
        self.dispatcher = dispatcher or default_dispatcher(self.job_settings, workers, name)
        self.worker_id = worker_identity()
        self.ledger = Ledger(store)
        self.max_running_per_run = max_running_per_run
        """A run's jobs running at once (those :meth:`capped_clause` selects); None: no cap."""
        self._reaper: threading.Thread | None = None
        self._stopping = threading.Event()
        self._pump_lock = threading.RLock()  # a final hook may submit (and so pump) again

    # -- routing (overridable) ------------------------------------------------------------

    def task_name(self, job: Any) -> str:
        return f"rsigym.{self.kind}.run"

    def extra_tasks(self, job: Any) -> list[str]:
        """More tasks sent with a job (evaluation: helpers that share its trials)."""
        return []

    def task_body(self, task: str) -> Callable[[str], bool]:
        """What a task of this name runs in a worker."""
        return self.execute

    def capped_clause(self, table: Any) -> Any:
        """SQL over ``table`` (the job table or an alias): the jobs that count against (and are
        held by) the per-run cap. All, by default."""
        return true()

    # -- submitting: the fair queue ---------------------------------------------------------

    def submit(self, job_id: str) -> None:
        """A job was queued: hand out what may start now (this job when it is its turn)."""
        self.pump()

    def pump(self) -> int:
        """Send queued jobs to workers while there is room, fairest first (see the module's
        docstring); queued jobs with a cancel request end here. Returns how many were sent.
        Raises :class:`ServiceUnavailable` when the broker cannot take a job (it stays queued)."""
        if self._stopping.is_set():
            return 0
        with self._pump_lock:
            picked, cancelled = self._pick()
            for job_id in cancelled:
                self.cancel_queued(job_id)
            sent = 0
            for n, (job_id, queue, tasks) in enumerate(picked):
                try:
                    for i, task in enumerate(tasks):
                        free = self._free()
                        if i > 0 and free is not None and free <= len(picked) - n - 1:
                            break  # helpers only on workers no picked job needs
                        self.dispatcher.dispatch(self, job_id, queue, task)
                except Exception:
                    self._undispatch(job_id)
                    raise
                sent += 1
            return sent

    def pump_quietly(self) -> None:
        """:meth:`pump` where nobody waits for an answer (after a job, in a reaper round)."""
        try:
            self.pump()
        except Exception as err:  # noqa: BLE001 - the jobs stay queued; the next event pumps again
            log.warning("%s queue not pumped: %s", self.kind, err.message if isinstance(err, GymError) else type(err).__name__)

    def _free(self) -> int | None:
        free = getattr(self.dispatcher, "free", None)
        return None if free is None else int(free())

    def _undispatch(self, job_id: str) -> None:
        t = self.table
        with self.store.transaction() as s:
            s.execute(update(t).where(t.id == job_id, t.status == "queued").values(dispatched_at=None)
                      .execution_options(synchronize_session=False))

    def _snapshot(self, s: Session) -> tuple[list[_Waiting], dict[str, int], dict[str, float]]:
        """Queued jobs, each run's load (capped jobs running or sent), and each waiting run's last start."""
        t = self.table
        capped = self.capped_clause(t)
        since = func.coalesce(t.queued_at, t.created_at)
        rows = s.execute(select(t.id, t.run_id, t.queue, since, t.dispatched_at, t.cancel_requested, capped)
                         .where(t.status == "queued").order_by(since, t.id)).all()
        # Celery: a task published long ago and never taken was lost; it goes out again.
        republish = None if self._free() is not None else utcnow() - timedelta(seconds=self.job_settings.republish_after_s)
        waiting = [_Waiting(id=r[0], run_id=r[1], queue=r[2], since=_aware(r[3]), capped=bool(r[6]), cancel=bool(r[5]),
                            dispatched=r[4] is not None and (republish is None or _aware(r[4]) >= republish))
                   for r in rows]
        runs = {w.run_id for w in waiting}
        load: dict[str, int] = {}
        last_start: dict[str, float] = {}
        if runs:
            for run, n in s.execute(select(t.run_id, func.count()).where(t.status == "running", capped,
                                                                         t.run_id.in_(runs)).group_by(t.run_id)):
                load[run] = n
            for run, started in s.execute(select(t.run_id, func.max(t.started_at)).where(
                    t.run_id.in_(runs), t.started_at.is_not(None)).group_by(t.run_id)):
                last_start[run] = _aware(started).timestamp()
        for w in waiting:
            if w.dispatched and w.capped:
                load[w.run_id] = load.get(w.run_id, 0) + 1
        return waiting, load, last_start

    def _pick(self) -> tuple[list[tuple[str, str, list[str]]], list[str]]:
        """Choose and mark (``dispatched_at``) the jobs to send now; and the cancelled queued ones."""
        t = self.table
        cap = self.max_running_per_run
        free = self._free()
        with self.store.transaction() as s:
            waiting, load, last_start = self._snapshot(s)
            cancelled = [w.id for w in waiting if w.cancel]
            waiting = [w for w in waiting if not w.cancel]
            room: dict[str, int] = {}
            for w in waiting:
                if w.dispatched:
                    room[w.queue] = room.get(w.queue, self.job_settings.publish_ahead) - 1
            picked: list[tuple[str, str, list[str]]] = []
            for w in fair_order([w for w in waiting if not w.dispatched], load, last_start):
                if free is not None and free <= 0:
                    break
                if free is None and room.get(w.queue, self.job_settings.publish_ahead) <= 0:
                    continue
                if cap is not None and w.capped and load.get(w.run_id, 0) >= cap:
                    continue
                now = utcnow()
                if _updated(s, update(t).where(t.id == w.id, t.status == "queued",
                                               t.cancel_requested.is_(False)).values(dispatched_at=now)) != 1:
                    continue
                job = s.get(t, w.id)
                picked.append((w.id, w.queue, [self.task_name(job), *self.extra_tasks(job)]))
                if w.capped:
                    load[w.run_id] = load.get(w.run_id, 0) + 1
                if free is not None:
                    free -= 1
                else:
                    room[w.queue] = room.get(w.queue, self.job_settings.publish_ahead) - 1
        return picked, cancelled

    def queue_info(self, session: Session, job: Any) -> dict[str, Any]:
        """``queue_position`` (1 = next to start on its queue; None once it left the queue) and
        ``queued_s`` (seconds it waited: so far while queued, until it started otherwise)."""
        since = _aware(job.queued_at or job.created_at)
        if job.status != "queued":
            end = job.started_at or job.finished_at
            waited = max(0.0, (_aware(end) - since).total_seconds()) if end is not None else None
            return {"queue_position": None, "queued_s": None if waited is None else round(waited, 3)}
        waiting, load, last_start = self._snapshot(session)
        same = [w for w in waiting if w.queue == job.queue and not w.cancel]
        ahead = sorted((w for w in same if w.dispatched), key=lambda w: (w.since, w.id))
        order = [w.id for w in ahead + fair_order([w for w in same if not w.dispatched], load, last_start)]
        position = order.index(job.id) + 1 if job.id in order else None
        return {"queue_position": position,
                "queued_s": round(max(0.0, (utcnow() - since).total_seconds()), 3)}

    def cancel_queued(self, job_id: str) -> bool:
        """Cancel a job no worker has taken yet; it ends like any other (its final hooks run)."""
        return self._finish(job_id, "cancelled", None, only_queued=True)

    def recover(self) -> None:
        """At start: jobs whose worker is gone are reaped, queued ones are (re)sent.

        Embedded, this process was the only worker, so every running job died with it. With
        Celery, other workers may be running jobs right now: only stale heartbeats are reaped,
        and workers reap on their own as well (:meth:`start_reaper`)."""
        t = self.table
        if isinstance(self.dispatcher, PoolDispatcher):
            with self.store.transaction() as s:  # what was handed to the old pool went with it
                s.execute(update(t).where(t.status == "queued").values(dispatched_at=None)
                          .execution_options(synchronize_session=False))
            self.reap_stale(ttl_s=0, reason="the gym restarted during this job")
        else:
            self.reap_stale()
            self.start_reaper()
        self.pump_quietly()  # the broker is down: the jobs stay queued for the next event

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
        if self._free() is None:  # Celery: its published slot is free; the next job may go out
            self.pump_quietly()
        try:
            with self._heartbeat(job_id):
                try:
                    self._run(job)
                except Exception as err:  # noqa: BLE001 - a job ends in a final state whatever happens
                    log.exception("%s job %s crashed", self.kind, job_id)
                    self._finish(job_id, "failed", self.describe_error(err))
            if self._still_mine(job_id):  # _run returned without a final state: that is a bug, not a success
                self._finish(job_id, "failed", "internal error: the job ended without a result")
        finally:
            if self._free() is None:  # Celery: the run's slot is free (embedded: the pool pumps)
                self.pump_quietly()
        return True

    def claim(self, job_id: str) -> Any | None:
        """Atomically take a queued job for this worker; None if someone else has it."""
        t = self.table
        now = utcnow()
        for _ in range(2):
            with self.store.transaction() as s:
                taken = _updated(s, update(t).where(t.id == job_id, t.status == "queued", t.cancel_requested.is_(False),
                                                    self._under_cap(s, job_id))
                                 .values(status="running", worker=self.worker_id, heartbeat_at=now, claims=t.claims + 1,
                                         started_at=func.coalesce(t.started_at, now)))
                job = s.get(t, job_id, populate_existing=True)
                if job is None:
                    return None
                if taken == 1:
                    s.expunge(job)
                    return job
                status, cancel, heartbeat = job.status, job.cancel_requested, job.heartbeat_at
            if status == "queued" and not cancel:
                # Its run is at its cap (a task sent by something other than the pump, or a race):
                # it stays queued and goes out again when a slot frees.
                log.info("%s job %s: its run is at its running-jobs cap; it stays queued", self.kind, job_id)
                self._undispatch(job_id)
                return None
            if status == "queued" and cancel:
                self._finish(job_id, "cancelled", None)
                return None
            if status == "running" and (heartbeat is None or heartbeat < utcnow() - self._ttl()):
                # A redelivered task for a job whose worker died: reap it, then take it if it was re-queued.
                self.reap_stale(only=job_id)
                continue
            return None
        return None

    def _under_cap(self, s: Session, job_id: str) -> Any:
        """SQL for the claim's WHERE: the job is not capped, or its run has room. On PostgreSQL the
        run's claims are serialised by an advisory lock held to the end of the transaction (so
        two workers cannot both see the last free slot); SQLite serialises writers already."""
        cap = self.max_running_per_run
        if cap is None:
            return true()
        t = self.table
        run_id = s.scalar(select(t.run_id).where(t.id == job_id))
        if run_id is None:
            return true()
        if self.store.dialect == "postgresql":
            s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key(t.__tablename__, run_id)})
        other = aliased(t)
        running = (select(func.count()).select_from(other)
                   .where(other.run_id == run_id, other.status == "running", self.capped_clause(other))
                   .scalar_subquery())
        return or_(~self.capped_clause(t), running < cap)

    def _run(self, job: Any) -> None:
        raise NotImplementedError

    def describe_error(self, err: Exception) -> str:
        full = storage_full(err)
        return full.message if full is not None else f"internal error: {type(err).__name__}"

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

    def _finish(self, job_id: str, status: str, error: str | None, *, only_queued: bool = False) -> bool:
        """Put the job in a final state, once: a queued job, or a running one this worker holds.
        Returns False when it was already final (or reaped, or taken over by another worker)."""
        t = self.table
        mine = (t.status == "running") & (t.worker == self.worker_id)
        with self.store.transaction() as s:
            done = _updated(s, update(t).where(t.id == job_id, t.status == "queued" if only_queued
                                               else or_(t.status == "queued", mine))
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
            error = reason if not self.resumable else (
                f"{reason}; not resumed again: it was started {_times(claims or 0)} and "
                f"RSIGYM_JOBS_MAX_RESUMES allows {self.job_settings.max_resumes} resumes")
            with self.store.transaction() as s:
                values: dict[str, Any] = (
                    {"status": "queued", "worker": None, "heartbeat_at": None, "queued_at": utcnow(),
                     "dispatched_at": None} if resume
                    else {"status": "failed", "error": error, "finished_at": utcnow()})
                if _updated(s, update(t).where(t.id == job_id, stale).values(**values)) != 1:
                    continue
                if not resume:
                    self._on_final(s, job_id, "failed")
            reaped += 1
            released = self.release_holds(job_id)
            log.warning("%s job %s: %s; %s (%d ledger holds released)", self.kind, job_id, reason,
                        "re-queued" if resume else "failed", released)
            self._after_reaped(job_id)
            if not resume:
                self._after_final(job_id, "failed", error)
        if reaped:  # re-queued jobs go out again, and the dead jobs' runs have free slots
            self.pump_quietly()
        return reaped

    def release_holds(self, job_id: str) -> int:
        """Release reservations the job still holds (a dead worker's step that never settled)."""
        with self.store.transaction() as s:
            held = s.scalars(select(LedgerEntry.id).where(LedgerEntry.ref_id == job_id, OPEN_ROW)).all()
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
                self.pump_quietly()  # a lost event (a crashed pump, a lost task) is made up for here

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


def merged_figures(parts: list[dict[str, tuple[int, float]]]) -> dict[str, tuple[int, float]]:
    """Queue figures of several job tables as one: depths summed, the oldest age kept."""
    figures: dict[str, tuple[int, float]] = {}
    for part in parts:
        for queue, (depth, age) in part.items():
            old_depth, old_age = figures.get(queue, (0, 0.0))
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


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _aware(value: Any) -> Any:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

