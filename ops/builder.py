"""Assembling a gym: embedded (everything in one process) or one part of a distributed one."""

from __future__ import annotations

import importlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
from fastapi import FastAPI

from gateway.app import create_gateway_app
from gateway.asgi_transport import StreamingASGITransport
from gateway.context import Gateway
from gateway.direct_call import DirectService
from gateway.service_link import ServiceLink
from kit.config import GymConfig, load_config
from kit.no_proxy import keep_off_proxies
from kit.private_files import private_dir, write_private
from kit.redact import install_log_redaction
from kit.settings import GymSettings, ProviderSecrets, StoreSettings, plain_gateway_url
from kit.spec import ServiceContext
from ops.admin_routes import mount_operator
from storage.store import Store, sqlite_url

SERVICES = ("rollout", "training", "inference", "sandbox", "evaluation", "records")


def service_modules() -> dict[str, ModuleType]:
    """Service name → its light ``spec`` module (``SPEC``: routes and estimators). The gateway
    needs nothing else of a service; a gateway-only process never imports a service app."""
    return {name: importlib.import_module(f"services.{name}.spec") for name in SERVICES}


def app_factory(name: str) -> Callable[[ServiceContext], Any]:
    """``create_app(context)`` of one service: its app module is imported only here, where a
    process runs that service (embedded mode, ``rsigym serve <service>``)."""
    return importlib.import_module(f"services.{name}.app").create_app


UPSTREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=900.0, write=60.0, pool=60.0)


@dataclass
class Gym:
    app: FastAPI
    gateway: Gateway
    admin_token: str
    service_apps: dict[str, FastAPI]

    def listening_at(self, url: str) -> None:
        """Embedded mode: where this gym's server listens (``rsigym up`` knows its --host and
        --port), so evaluation trials and sandbox doors call back there. An operator's
        RSIGYM_GATEWAY_URL wins. Without either, work that must call back is refused."""
        settings = self.gateway.context.settings
        if not settings.gateway_url:
            settings.gateway_url = plain_gateway_url(url)
        keep_off_proxies(settings.gateway_url)


def own_url(host: str, port: int) -> str:
    """The URL a server bound to ``host:port`` is reached at from this host (a wildcard
    bind is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def require_gateway_url(settings: GymSettings, part: str) -> None:
    if not settings.gateway_url:
        raise SystemExit(
            f"distributed mode ({part}) needs RSIGYM_GATEWAY_URL: the address at which services, evaluation "
            "trials and sandbox doors reach the gateway (it is never taken from a request's Host header)")


STORE_OPTIONAL = frozenset({"rollout"})
"""The parts that may run without the shared store in distributed mode: the rollout service holds
the provider keys and is kept off the store by design (docker-compose.yml, deploy/helm); the little
it writes (the agent route's turns) then lands in SQLite in its own data dir, and it says so."""


def require_shared_store(store_settings: StoreSettings, part: str) -> str | None:
    """Distributed mode: every part on the one SQL store (RSIGYM_STORE_URL). Without it a part
    would open SQLite in its own data dir and run as a gym apart (a split brain: keys the gateway
    minted unknown to it, records no audit reads). Refused with SystemExit, except for a part of
    :data:`STORE_OPTIONAL`, for which the warning to print is returned. Embedded mode keeps SQLite."""
    if store_settings.url:
        return None
    if part in STORE_OPTIONAL:
        return (f"{part}: no RSIGYM_STORE_URL, so what it records (the agent route's turns) goes to SQLite in its "
                "own data dir, not the shared store")
    raise SystemExit(
        f"distributed mode ({part}) needs RSIGYM_STORE_URL, the SQL store (PostgreSQL) every part of the gym "
        "shares: without it this part would run on a SQLite file of its own, apart from the others. "
        "For one process on SQLite, run `rsigym up` (embedded mode)")


def ensure_admin_token(settings: GymSettings) -> str:
    """RSIGYM_ADMIN_TOKEN, or a fresh token written to <data-dir>/admin-token (mode 0600)."""
    if settings.admin_token:
        return settings.admin_token
    token = "rsa-" + secrets.token_urlsafe(32)
    path = private_dir(settings.data_dir) / "admin-token"
    write_private(path, token + "\n")
    return token


def ensure_internal_secret(settings: GymSettings) -> str:
    """RSIGYM_INTERNAL_SECRET, or the embedded gym's own, kept in <data-dir>/internal-secret (mode
    0600) so it survives a restart: it signs gateway→service identities and seals each run's record
    chain (services/records/events.py), whose heads would all read as forged under a fresh secret."""
    if settings.internal_secret:
        return settings.internal_secret
    path = Path(settings.data_dir) / "internal-secret"
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing
    secret = secrets.token_urlsafe(32)
    private_dir(path.parent)
    write_private(path, secret + "\n")
    return secret


def open_store(settings: GymSettings, store_settings: StoreSettings, *, schema: str | None = None) -> Store:
    store = Store(store_settings.url or sqlite_url(settings.data_dir), store_settings, schema=schema)
    store.migrate()
    return store


def build_embedded(
    settings: GymSettings | None = None,
    store_settings: StoreSettings | None = None,
    config: GymConfig | None = None,
    *,
    store: Store | None = None,
    provider_secrets: ProviderSecrets | None = None,
    run_reaper: bool = True,
) -> Gym:
    """The gateway and every service in one process; services are reachable only through
    the gateway (in-process streaming transport, still signed)."""
    settings = settings or GymSettings()
    private_dir(settings.data_dir)  # 0700: no other local user lists or reads the gym's files
    keep_off_proxies(settings.gateway_url)
    config = config or load_config(settings.config)
    provider_secrets = provider_secrets or ProviderSecrets()
    install_log_redaction(*provider_secrets.values(config.provider_key_envs()))
    context = ServiceContext(
        config=config,
        store=store or open_store(settings, store_settings or StoreSettings()),
        settings=settings,
        internal_secret=ensure_internal_secret(settings),
        secrets=provider_secrets,
    )
    admin_token = ensure_admin_token(settings)
    modules = service_modules()
    service_apps = {name: app_factory(name)(context) for name in modules}
    links = {name: ServiceLink(f"http://{name}.internal", StreamingASGITransport(service_app), UPSTREAM_TIMEOUT,
                               direct=DirectService(service_app, server=(f"{name}.internal", 80)))
             for name, service_app in service_apps.items()}
    specs = {name: module.SPEC for name, module in modules.items()}
    closers = [close for a in service_apps.values() if (close := getattr(a.state, "close", None)) is not None]
    gw = Gateway(context=context, admin_token=admin_token, specs=specs, links=links, closers=closers)
    return Gym(create_gateway_app(gw, run_reaper=run_reaper, operator=mount_operator), gw, admin_token, service_apps)


def build_gateway(
    settings: GymSettings, store_settings: StoreSettings, service_urls: dict[str, str], config: GymConfig | None = None
) -> Gym:
    """Distributed mode: the same gateway, forwarding over HTTP to separately run services."""
    if not settings.internal_secret:
        raise SystemExit("distributed mode needs RSIGYM_INTERNAL_SECRET shared by the gateway and the services")
    require_gateway_url(settings, "gateway")
    if not settings.admin_token:  # a token made up per replica would open the admin API on one replica only
        raise SystemExit("distributed mode needs RSIGYM_ADMIN_TOKEN, the same on every gateway replica")
    modules = service_modules()
    unknown = set(service_urls) - set(modules)
    if unknown:
        raise SystemExit(f"unknown services: {', '.join(sorted(unknown))}")
    keep_off_proxies(settings.gateway_url, *service_urls.values())
    context = ServiceContext(
        config=config or load_config(settings.config),
        store=open_store(settings, store_settings),
        settings=settings,
        internal_secret=settings.internal_secret,
        secrets=ProviderSecrets(),
    )
    admin_token = ensure_admin_token(settings)
    links = {name: ServiceLink(url, httpx.AsyncHTTPTransport(), UPSTREAM_TIMEOUT) for name, url in service_urls.items()}
    specs = {name: modules[name].SPEC for name in service_urls}
    gw = Gateway(context=context, admin_token=admin_token, specs=specs, links=links)
    return Gym(create_gateway_app(gw, operator=mount_operator), gw, admin_token, {})


def build_service(
    name: str, settings: GymSettings, config: GymConfig | None = None, store_settings: StoreSettings | None = None
) -> FastAPI:
    """Distributed mode: one service as its own app (it accepts only gateway-signed calls)."""
    modules = service_modules()
    if name not in modules:
        raise SystemExit(f"unknown service {name!r}; known: {', '.join(modules)}")
    if not settings.internal_secret:
        raise SystemExit("a service needs RSIGYM_INTERNAL_SECRET shared with the gateway")
    require_gateway_url(settings, name)
    private_dir(settings.data_dir)  # 0700: no other local user lists or reads the gym's files
    keep_off_proxies(settings.gateway_url)
    config = config or load_config(settings.config)
    provider_secrets = ProviderSecrets()
    install_log_redaction(*provider_secrets.values(config.provider_key_envs()))
    context = ServiceContext(
        config=config,
        store=open_store(settings, store_settings or StoreSettings()),
        settings=settings,
        internal_secret=settings.internal_secret,
        secrets=provider_secrets,
    )
    return app_factory(name)(context)
