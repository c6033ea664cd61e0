"""The Celery app: one task per job kind (and evaluation purpose) on per-role queues.

Queues: ``training`` (CPU), ``training-gpu`` (bases served by vLLM), ``evaluation`` — each with
RSIGYM_WORKER_QUEUE_PREFIX in front. The broker is RSIGYM_WORKER_BROKER_URL (Redis).

A task carries only a job id; everything else is in the store. Tasks are acknowledged late and
rejected when their worker is lost, so Redis hands a killed worker's task to another worker; the
task body (:meth:`jobs.lifecycle.JobRunnerBase.execute`) is idempotent — a job that is final,
or running elsewhere with a fresh heartbeat, is left alone — so a redelivered or duplicate task
does nothing, and a job whose worker died is reaped by the heartbeat TTL.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import Celery

from jobs.lifecycle import DISPATCHERS, JobRunnerBase
from kit.errors import ServiceUnavailable
from kit.settings import WorkerSettings

log = logging.getLogger("rsigym.worker")

TASKS = {
    "rsigym.training.run": "training",
    "rsigym.evaluation.run": "evaluation",  # an agent's evaluation job
    "rsigym.evaluation.score": "evaluation",  # scoring a run's submission
    "rsigym.evaluation.baseline": "evaluation",  # the initial system's score
    "rsigym.evaluation.validation": "evaluation",  # benchmark validation (oracle 1, nop 0)
    "rsigym.evaluation.assist": "evaluation",  # a helper sharing a running job's trials
}
"""Task name → the job kind whose runner executes it."""


class RunnerHost:
    """The runners a worker process executes tasks with (set by :func:`services.worker.main.run_worker`)."""

    def __init__(self) -> None:
        self.runners: dict[str, JobRunnerBase] = {}

    def runner(self, kind: str) -> JobRunnerBase:
        runner = self.runners.get(kind)
        if runner is None:
            raise RuntimeError(f"this worker runs no {kind} jobs (check --queues)")
        return runner


def make_celery(settings: WorkerSettings) -> tuple[Celery, RunnerHost]:
    app = Celery("rsigym", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=5,
        worker_hijack_root_logger=False,
        task_default_queue=settings.queue_prefix + "training",
    )
    host = RunnerHost()
    for name, kind in TASKS.items():
        # shared=False: Celery would otherwise put the task on every app of the process (a service's
        # dispatcher has its own app, without runners).
        app.task(name=name, acks_late=True, reject_on_worker_lost=True, shared=False)(_task_body(host, name, kind))
    return app, host


def _task_body(host: RunnerHost, name: str, kind: str) -> Any:
    def run(job_id: str) -> bool:
        return host.runner(kind).task_body(name)(job_id)

    run.__name__ = f"run_{kind}_job"
    return run


@functools.cache
def _app_for(broker_url: str, queue_prefix: str, visibility_timeout_s: float) -> Celery:
    settings = WorkerSettings(broker_url=broker_url, queue_prefix=queue_prefix, visibility_timeout_s=visibility_timeout_s)
    return make_celery(settings)[0]


class CeleryDispatcher:
    """Distributed mode: a queued job becomes a task on its queue."""

    def __init__(self, settings: WorkerSettings | None = None, app: Celery | None = None):
        self.settings = settings or WorkerSettings()
        self.app = app or _app_for(self.settings.broker_url, self.settings.queue_prefix,
                                   self.settings.visibility_timeout_s)

    def dispatch(self, runner: JobRunnerBase, job_id: str, queue: str, task: str) -> None:
        try:
            self.app.send_task(task, args=[job_id], queue=self.settings.queue_prefix + queue)
        except Exception as err:  # noqa: BLE001 - kombu raises many types; the job stays queued and is re-sent at the next start
            log.error("job %s could not be sent to queue %s: %s", job_id, queue, type(err).__name__)
            raise ServiceUnavailable("the job queue (RSIGYM_WORKER_BROKER_URL) cannot be reached; "
                                     "the job stays queued") from err

    def shutdown(self) -> None:
        """Nothing runs here; the workers own the jobs."""


@DISPATCHERS.register("celery")
def _celery_dispatcher(workers: int, name: str) -> CeleryDispatcher:
    """Whatever the runner's pool size and name: the workers are elsewhere."""
    return CeleryDispatcher()
