"""Process settings (pydantic-settings). The only module that reads the environment.

Each concern has its own class and env prefix; the gym config file (TOML, see
:mod:`kit.config`) holds what an operator declares about models and prices.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import httpx
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kit.private_files import traversable_dir


def default_data_dir() -> Path:
    return Path.home() / ".rsigym"


def default_models_dir() -> Path:
    """Where every gym on this machine (``rsigym up``, ``rsigym demo``, the tests) keeps built and
    converted base models unless ``RSIGYM_MODELS_DIR`` says otherwise: one build serves them all
    (builds are keyed by their recipe and take a file lock)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rsigym" / "models"


class GymSettings(BaseSettings):
    """Operator-side settings shared by the gateway and every service (prefix ``RSIGYM_``)."""

    model_config = SettingsConfigDict(env_prefix="RSIGYM_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    config: Path | None = None  # RSIGYM_CONFIG: the gym config TOML
    admin_token: str | None = None  # RSIGYM_ADMIN_TOKEN; `rsigym up` writes one when unset
    internal_secret: str | None = None  # HMAC key for gateway→service identities
    host: str = "127.0.0.1"
    port: int = 8700
    url: str = "http://127.0.0.1:8700"  # RSIGYM_URL, used by the operator CLI as a client
    gateway_url: str | None = None
    """RSIGYM_GATEWAY_URL: where services, evaluation trials and sandbox model doors reach the
    gateway — the only address a platform-minted credential is ever sent to. Never taken from a
    request (``Host``, ``X-Forwarded-*`` and ``Forwarded`` are the caller's to forge). Embedded,
    ``rsigym up`` sets it from its own --host/--port when unset; distributed mode requires it."""
    metrics_token: str | None = None
    """RSIGYM_METRICS_TOKEN: a scrape token that may read GET /metrics (which is otherwise
    admin-only); it opens nothing else."""
    models_dir: Path | None = None
    """RSIGYM_MODELS_DIR: built and converted base models (default :func:`default_models_dir`,
    ``~/.cache/rsigym/models``, shared by every gym of this machine)."""
    scratch_dir: Path | None = None
    """RSIGYM_SCRATCH_DIR: scratch space of sandboxes (their control dirs; their files live in a
    tmpfs of the template's disk_mb) and jobs (custom-loss work dirs, benchmark unpacking), apart
    from the data dir's store. Default: the system's temporary dir ($TMPDIR, else /tmp). Sandbox
    uids must be able to traverse it (o+x on every parent) when the gym runs as root."""
    tinker_session_ttl_s: float = Field(default=120.0, ge=0)
    """RSIGYM_TINKER_SESSION_TTL_S: a Tinker API session that sends no heartbeat (nor any call
    naming it, its training models or its sampling sessions) for this long is expired — finished
    as the SDK's ``close()`` finishes it (services/training/tinker_api/sessions.py). The SDK beats
    every 10 s: the default is 12 missed beats. 0 = sessions never expire."""

    @field_validator("gateway_url")
    @classmethod
    def _plain_url(cls, value: str | None) -> str | None:
        return None if value is None else plain_gateway_url(value)

    def resolved_models_dir(self) -> Path:
        return Path(self.models_dir) if self.models_dir else default_models_dir()

    def resolved_scratch_dir(self) -> Path:
        path = Path(self.scratch_dir) if self.scratch_dir else Path(tempfile.gettempdir())
        return traversable_dir(path)  # made 0711 under the gym's 0077 umask: sandbox uids walk through


def plain_gateway_url(value: str) -> str:
    """A plain http(s)://host[:port][/prefix] URL without a trailing slash, or ValueError."""
    url = httpx.URL(value)
    if url.scheme not in ("http", "https") or not url.host or url.query or url.fragment or url.userinfo:
        raise ValueError("RSIGYM_GATEWAY_URL must be a plain http(s)://host[:port][/prefix] URL")
    return value.rstrip("/")


class StoreSettings(BaseSettings):
    """Where the SQL store lives (prefix ``RSIGYM_STORE_``). Empty url = SQLite in the data dir."""

    model_config = SettingsConfigDict(env_prefix="RSIGYM_STORE_", extra="ignore")

    url: str | None = None
    pool_size: int = 20
    max_overflow: int = 20
    pool_timeout_s: float = 10.0
    connect_timeout_s: int = 5
    sqlite_busy_timeout_ms: int = 60_000
    group_commit_max: int = Field(default=256, ge=1)
    """The most ledger operations that share one transaction and one commit (group commit,
    storage/group_commit.py). 1 = every operation commits on its own."""
    sqlite_writer_cache_mib: int = Field(default=16, ge=0)
    """SQLite: the page cache of the store's writer thread's connection while it leads batches,
    and of the connection a lone call from an event loop commits on (storage/group_commit.py),
    in MiB; SQLite's default (2 MiB) elsewhere. The ledger's
    reservations insert at random places in its id and (run, key) indexes: with the default the
    writer re-reads most of those pages from the file on every batch once the ledger passes ~10^5
    rows. 0 = SQLite's default there too."""
    sqlite_checkpoint_thread: bool = True
    """SQLite: copy the WAL back into the database on a thread of the store's own, off the
    request path (storage/sqlite_checkpoints.py). False = SQLite's own automatic
    checkpoint, inside whichever commit takes the WAL past 1,000 pages."""
    statement_timeout_ms: int = Field(default=30_000, ge=0)
    """PostgreSQL: a statement that waits longer (a row locked by a stuck session, an overloaded
    server) is cancelled and the call refused with 503 ``store_unavailable`` instead of hanging; its
    transaction rolls back, so nothing is held. 0 = no limit. Migrations run without it."""


class RedisSettings(BaseSettings):
    """Redis (prefix ``RSIGYM_REDIS_``): RSIGYM_REDIS_URL, e.g. ``redis://redis:6379/0``.

    Unset = embedded mode: no key-change fan-out between processes. A gateway then caches
    principals only on SQLite (one process: its own key changes invalidate its cache); on
    PostgreSQL, where other replicas may change keys unseen, it does not cache at all."""

    model_config = SettingsConfigDict(env_prefix="RSIGYM_REDIS_", extra="ignore")

    url: str | None = None
    key_channel: str = "rsigym:keys"
    """The pub/sub channel on which key revocations, pauses and policy edits are announced."""
    socket_timeout_s: float = 1.0
    """Connect/publish timeout. A Redis outage delays a key change by about twice this (one
    retry), then it is logged; the change itself is already committed."""


class RecordAnchorSettings(BaseSettings):
    """Where each run's record-chain head is anchored outside the store (prefix
    ``RSIGYM_RECORD_ANCHOR_``; services/records/record_anchor.py). Every process that appends events
    or checks chains must use the same anchor: with Redis, every process of the gym needs
    RSIGYM_REDIS_URL."""

    model_config = SettingsConfigDict(env_prefix="RSIGYM_RECORD_ANCHOR_", extra="ignore")

    kind: Literal["auto", "file", "redis"] = "auto"
    """``auto``: Redis when RSIGYM_REDIS_URL is set (distributed), else a file in the data dir."""
    path: Path | None = None
    """The file anchor (default ``<data-dir>/record-anchor.log``)."""
    redis_url: str | None = None
    """The Redis anchor's server (default RSIGYM_REDIS_URL)."""
    key_prefix: str = "rsigym:record-anchor:"
    namespace: str | None = None
    """Keeps gyms that share one Redis apart (default: derived from the internal secret, the same
    on every replica of a gym)."""
    redis_timeout_s: float = Field(default=2.0, gt=0)

class PrincipalCacheSettings(BaseSettings):
    """The gateway's cache of authenticated keys (prefix ``RSIGYM_PRINCIPAL_CACHE_``).

    An entry lives at most ``ttl_s`` after the store read it came from, and is dropped as
    soon as a key change of its chain is announced; budgets are never cached."""

    model_config = SettingsConfigDict(env_prefix="RSIGYM_PRINCIPAL_CACHE_", extra="ignore")

    ttl_s: float = Field(default=2.0, ge=0)
    """0 disables the cache."""
    max_entries: int = Field(default=10_000, ge=1)


class JobSettings(BaseSettings):
    """How long jobs (training, evaluation) run (prefix ``RSIGYM_JOBS_``).

    ``backend``: ``embedded`` runs them on in-process threads (``rsigym up``); ``celery`` sends
    them as Celery tasks to ``rsigym worker`` processes (see services/worker/). A running job's
    worker renews ``heartbeat_at`` every ``heartbeat_interval_s``; a job whose heartbeat is older
    than ``heartbeat_ttl_s`` belongs to a dead worker and is reaped (jobs/lifecycle.py)."""

    model_config = SettingsConfigDict(env_prefix="RSIGYM_JOBS_", extra="ignore")

    backend: Literal["embedded", "celery"] = "embedded"
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_ttl_s: float = Field(default=30.0, gt=0)
    reap_interval_s: float = Field(default=10.0, gt=0)
    max_resumes: int = Field(default=2, ge=0)
    """How often a resumable job (training, evaluation) is re-queued after its worker died before it is failed."""
    publish_ahead: int = Field(default=1, ge=1)
    """Celery: jobs per queue published to the broker and not yet taken by a worker. The rest wait
    in the store and are published in fair order (jobs/lifecycle.py) as workers take jobs."""
    republish_after_s: float = Field(default=900.0, gt=0)
    """Celery: a published job no worker took within this time is published again (a lost task)."""


class WorkerSettings(BaseSettings):
    """Celery workers and the services that send them tasks (prefix ``RSIGYM_WORKER_``)."""

    model_config = SettingsConfigDict(env_prefix="RSIGYM_WORKER_", extra="ignore")

    broker_url: str = "redis://127.0.0.1:6379/0"
    """RSIGYM_WORKER_BROKER_URL: the Celery broker (Redis)."""
    queue_prefix: str = ""
    """Prepended to the queue names (``training``, ``training-gpu``, ``evaluation``), so several gyms
    (or tests) can share one Redis."""
    concurrency: int = Field(default=1, ge=1)
    """Jobs one worker process runs at once (threads)."""
    visibility_timeout_s: float = Field(default=3600.0, gt=0)
    """Redis redelivers a task not acknowledged within this time (tasks are acknowledged late, so
    a killed worker's task comes back); a redelivered task whose job is alive does nothing."""


class EgressSettings(BaseSettings):
    """``rsigym egress-proxy``, a run's egress allowlist proxy in compose mode (prefix ``RSIGYM_EGRESS_``)."""

    model_config = SettingsConfigDict(env_prefix="RSIGYM_EGRESS_", extra="ignore")

    allow: str = ""
    """RSIGYM_EGRESS_ALLOW: the hosts the run's agent may reach, space or comma separated."""
    token: str | None = None
    """RSIGYM_EGRESS_TOKEN: the run's proxy credential; a request without it is refused (407). Only
    from the environment: a secret on a command line is every local user's to read."""


class ProviderSecrets:
    """Reads provider credentials named by the gym config (``api_key_env``).

    Secrets are looked up at call time from the platform's own environment, never stored
    in the config, the database or a response. The resolver also knows every value it has
    handed out so logs and errors can be scrubbed of them.
    """

    def __init__(self, environ: dict[str, str] | None = None):
        self._environ = environ if environ is not None else os.environ

    @property
    def environ(self) -> Mapping[str, str]:
        """Where the keys are read from (the platform's environment, or a test's mapping)."""
        return self._environ

    def get(self, env_name: str | None) -> str | None:
        if not env_name:
            return None
        return self._environ.get(env_name)

    def values(self, env_names: list[str]) -> list[str]:
        found = (self._environ.get(name) for name in env_names)
        return [value for value in found if value and len(value) >= 4]
