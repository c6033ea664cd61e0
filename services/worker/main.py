"""``rsigym worker --queues …``: a Celery worker that runs training and evaluation jobs.

It builds its runners exactly as the services do (same GymSettings, StoreSettings, gym config
and data dir), so a job runs the same code in a worker as in the embedded gym's thread pool. The
pool is threads: a job is one task; ``kill -9`` of the worker process kills its jobs with it,
and their heartbeats stop (jobs/lifecycle.py reaps them).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import Celery

from jobs.lifecycle import QUEUES, JobRunnerBase
from kit.config import GymConfig, load_config
from kit.no_proxy import keep_off_proxies
from kit.private_files import private_dir
from kit.redact import install_log_redaction
from kit.settings import GymSettings, ProviderSecrets, StoreSettings, WorkerSettings
from kit.spec import ServiceContext
from services.worker.celery_app import CeleryDispatcher, make_celery
from storage.store import Store, sqlite_url

log = logging.getLogger("rsigym.worker")

KIND_OF_QUEUE = {"training": "training", "training-gpu": "training", "evaluation": "evaluation"}


def parse_queues(text: str) -> list[str]:
    queues = [q.strip() for q in text.split(",") if q.strip()]
    unknown = sorted(set(queues) - set(QUEUES))
    if not queues or unknown:
        raise SystemExit(f"--queues takes a comma-separated subset of {', '.join(QUEUES)}"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return queues


def build_runners(kinds: set[str], settings: GymSettings, store_settings: StoreSettings,
                  config: GymConfig | None = None) -> dict[str, JobRunnerBase]:
    """The runners of the given job kinds, over the store and data dir the services use."""
    keep_off_proxies(settings.gateway_url)
    private_dir(settings.data_dir)  # 0700: no other local user lists or reads the gym's files
    config = config or load_config(settings.config)
    provider_secrets = ProviderSecrets()
    install_log_redaction(*provider_secrets.values(config.provider_key_envs()))
    store = Store(store_settings.url or sqlite_url(settings.data_dir), store_settings)
    store.migrate()
    context = ServiceContext(config=config, store=store, settings=settings,
                             internal_secret=settings.internal_secret or "", secrets=provider_secrets)
    runners: dict[str, JobRunnerBase] = {}
    if "training" in kinds:
        from services.training.service import TrainingService

        runners["training"] = TrainingService(context).runner
    if "evaluation" in kinds:
        if not settings.gateway_url:
            raise SystemExit("an evaluation worker needs RSIGYM_GATEWAY_URL (its trials reach the gateway there)")
        from services.evaluation.service import EvaluationService

        runners["evaluation"] = EvaluationService(context).runner
    return runners


def start_worker(queues: list[str], settings: GymSettings, store_settings: StoreSettings,
                 worker_settings: WorkerSettings, config: GymConfig | None = None) -> None:
    """Build the runners, reap what dead workers left, and consume ``queues`` until stopped."""
    app, host = make_celery(worker_settings)
    runners = build_runners({KIND_OF_QUEUE[q] for q in queues}, settings, store_settings, config)
    dispatcher = CeleryDispatcher(worker_settings, app)
    for runner in runners.values():
        runner.dispatcher.shutdown()  # whatever the env chose: in a worker, re-sent jobs go to Celery
        runner.dispatcher = dispatcher
        runner.reap_stale()
        runner.start_reaper()
    host.runners.update(runners)
    worker = _celery_worker(app, queues, worker_settings)
    log.info("worker %s consuming %s", worker.hostname, ", ".join(queues))
    worker.start()


def _celery_worker(app: Celery, queues: list[str], settings: WorkerSettings) -> Any:
    return app.Worker(
        queues=[settings.queue_prefix + q for q in queues],
        concurrency=settings.concurrency,
        pool="threads",
        hostname=f"rsigym-{os.getpid()}@{socket.gethostname()}",
        loglevel="INFO",
        without_gossip=True,
        without_mingle=True,
        optimization="fair",
    )
