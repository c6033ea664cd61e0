"""The commands that run a server or worker: ``rsigym up`` (the embedded gym), ``serve``,
``worker``, ``egress-proxy``, ``run-relay`` and ``standin``. Each imports its server stack
when it runs, so that the CLI's other commands start without it (tests/unit/ops/test_cli_start.py)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from kit.private_files import restrict_umask
from kit.settings import GymSettings
from ops.cli import gyms
from ops.cli.common import DataDirOpt, console, err_console, gym_settings
from ops.cli.progress import build_progress


def up(
    config: Annotated[Path | None, typer.Option("--config", help="Gym config TOML.")] = None,
    data_dir: DataDirOpt = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8700,
) -> None:
    """Run the embedded gym: gateway and every service in one process on one port."""
    import uvicorn

    restrict_umask()  # files at rest are the gym's alone (kit/private_files.py)

    from gateway.access_log import show_access_log
    from kit.body_limits import server_options
    from kit.heap import prepare_heap
    from ops.builder import build_embedded, own_url

    settings = gym_settings(data_dir, config)
    gym = build_embedded(settings)
    gym.listening_at(own_url(host, port))
    _prepare_models(gym.gateway.config, settings)
    token_note = "RSIGYM_ADMIN_TOKEN" if settings.admin_token else str(Path(settings.data_dir) / "admin-token")
    err_console.print(f"RSIGym embedded gym on http://{host}:{port}  (admin token: {token_note})")
    note = gyms.announce(f"http://{host}:{port}", Path(settings.data_dir))  # for the CLI's hints
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler it
    # found: make that handler an exit, so the note is taken back (the default one kills outright).
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    show_access_log(gym.gateway.config.logging.access)
    prepare_heap()
    try:
        uvicorn.run(gym.app, host=host, port=port, log_level="info", access_log=False,
                    **server_options(gym.gateway.config))
    finally:
        gyms.retract(note)


def _prepare_models(config: Any, settings: GymSettings) -> None:
    """Build or convert every builtin local base model before serving (cached after the first time)."""
    from services.models.loading import resolve_model_dir

    for model in config.models:
        if model.backend == "local" and model.path.startswith("builtin:"):
            err_console.print(f"preparing base model {model.name} ({model.path}) in {settings.resolved_models_dir()} …")
            with build_progress(err_console, f"building {model.name}") as on_step:
                resolve_model_dir(model, settings.resolved_models_dir(), on_step=on_step)


def serve(
    part: Annotated[str, typer.Argument(help="gateway, or a service name (rollout, training, inference, sandbox, evaluation, records)")],
    service: Annotated[list[str] | None, typer.Option("--service", help="For the gateway: NAME=URL of a service.")] = None,
    config: Annotated[Path | None, typer.Option("--config")] = None,
    data_dir: DataDirOpt = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8700,
) -> None:
    """Distributed mode: run the gateway or one service as its own server."""
    import uvicorn

    restrict_umask()  # files at rest are the gym's alone (kit/private_files.py)

    from gateway.access_log import show_access_log
    from kit.body_limits import server_options
    from kit.config import load_config
    from kit.heap import prepare_heap
    from kit.settings import StoreSettings
    from ops.builder import build_gateway, build_service, require_shared_store

    settings = gym_settings(data_dir, config)
    store_settings = StoreSettings()
    if (warning := require_shared_store(store_settings, part)) is not None:
        err_console.print(f"[bold yellow]warning[/bold yellow]: {warning}")
    if part == "gateway":
        urls = dict(item.split("=", 1) for item in service or [])
        asgi = build_gateway(settings, store_settings, urls).app
        show_access_log(load_config(settings.config).logging.access)
    else:
        asgi = build_service(part, settings, store_settings=store_settings)
    prepare_heap()
    uvicorn.run(asgi, host=host, port=port, log_level="info", access_log=False,
                **server_options(load_config(settings.config)))


def migrate(data_dir: DataDirOpt = None) -> None:
    """Bring the store (``RSIGYM_STORE_URL``, else the data dir's SQLite file) to the newest schema
    and exit: what a deployment runs once before its parts start (each part also migrates on start,
    under the store's lock, and finds nothing to do)."""
    from kit.settings import StoreSettings
    from ops.builder import open_store

    store_settings = StoreSettings()
    open_store(gym_settings(data_dir), store_settings).dispose()
    console.print(f"rsigym: store migrated ({'PostgreSQL' if store_settings.url else 'SQLite in the data dir'})")


def worker(
    queues: Annotated[str, typer.Option("--queues", help="Comma-separated: training, training-gpu, evaluation.")]
    = "training,evaluation",
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help="Jobs at once (threads).")] = None,
    config: Annotated[Path | None, typer.Option("--config")] = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Distributed mode: a Celery worker running training / evaluation jobs from Redis
    (RSIGYM_WORKER_BROKER_URL), over the same store and data dir as the services."""
    from kit.settings import StoreSettings, WorkerSettings
    from ops.builder import require_shared_store
    from services.worker.main import parse_queues, start_worker

    restrict_umask()  # files at rest are the gym's alone (kit/private_files.py)
    store_settings = StoreSettings()
    require_shared_store(store_settings, "worker")
    worker_settings = WorkerSettings()
    if concurrency is not None:
        worker_settings = worker_settings.model_copy(update={"concurrency": concurrency})
    start_worker(parse_queues(queues), gym_settings(data_dir, config), store_settings, worker_settings)


def egress_proxy(
    allow: Annotated[str | None, typer.Option("--allow", help="Hosts the agent may reach (host, host:port, "
                                              "*.domain), space or comma separated (default: RSIGYM_EGRESS_ALLOW); "
                                              "none: every request refused.")] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 3128,
) -> None:
    """The research agent's egress allowlist proxy (compose mode's per-run ``egress`` service; see
    kit/egress.py). With RSIGYM_EGRESS_TOKEN set, it serves only clients that present it."""
    import asyncio

    from kit.egress import EgressPolicy, serve_tcp
    from kit.settings import EgressSettings

    settings = EgressSettings()
    policy = EgressPolicy.from_env(allow if allow is not None else settings.allow)
    console.print(f"egress proxy on {host}:{port}: {len(policy.entries)} allowed host pattern(s)"
                  + (", run credential required" if settings.token else ""))
    asyncio.run(serve_tcp(policy, host, port, token=settings.token))


def run_relay(
    to: Annotated[str, typer.Option("--to", help="The gateway's URL (http://host:port).")],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8700,
) -> None:
    """A run's own path to the gateway (compose mode's per-run ``gym`` service): every connection
    on HOST:PORT is relayed, byte for byte, to the gateway; the run's network reaches nothing else."""
    import asyncio

    from ops.launcher import serve_relay

    console.print(f"relay on {host}:{port} to {to}")
    asyncio.run(serve_relay(host, port, to))


def standin(
    port: Annotated[int, typer.Option("--port")] = 8799,
    api_key_env: Annotated[str, typer.Option("--api-key-env", help="Env var holding the key it accepts.")] = "STANDIN_API_KEY",
    script: Annotated[Path | None, typer.Option(
        "--script", help='JSON file {"<model>": [{"tool": ..., "arguments": {...}} | {"say": ...}, ...]}: '
                         "the trajectory each model plays before it answers.")] = None,
) -> None:
    """Run the offline stand-in for a frontier-model API (see services/rollout/standin.py)."""
    import uvicorn
    from pydantic import ValidationError

    from kit.settings import ProviderSecrets
    from services.rollout.standin import create_standin_app, load_scripts

    key = ProviderSecrets().get(api_key_env)
    if not key:
        raise SystemExit(f"set {api_key_env} to the key the stand-in should accept")
    try:
        scripts = load_scripts(script) if script else None
    except (OSError, ValidationError) as err:
        raise SystemExit(f"{script}: not a stand-in script: {err}") from None
    uvicorn.run(create_standin_app(key, scripts=scripts), host="127.0.0.1", port=port, log_level="warning")
