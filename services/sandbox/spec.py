"""What the gateway knows of the sandbox service: its routes, served under ``/sandbox``, and
its policy knobs.

An agent points the unmodified E2B SDK at ``E2B_API_URL=<gym>/sandbox`` and
``E2B_SANDBOX_URL=<gym>/sandbox/envd`` with ``E2B_API_KEY=<run key>``. Control-plane calls
authenticate with the key (X-API-Key); daemon calls carry only the sandbox's access token,
which the gateway verifies (``auth="sandbox_token"``). No call is metered per request:
sandbox time is metered by the second, ahead, by the service itself
(services/sandbox/metering.py). Light: no app, router, e2b or backend import.
"""

from __future__ import annotations

from typing import Annotated, Any

from kit.config import GymConfig
from kit.policy_knobs import OnlyOff, PlatformGranted, PolicyExtras
from kit.spec import Operation, ServiceSpec
from services.sandbox.schemas import CreateSandbox


class SandboxPolicy(PolicyExtras):
    internet: Annotated[bool, OnlyOff("the parent key has no sandbox internet")] = False
    """Sandbox internet access."""
    build: Annotated[bool, PlatformGranted("template builds are granted by the platform only")] = False
    """May build sandbox templates from Dockerfiles (``POST /v2/templates``). Granted by the platform
    to the key that registers a benchmark's tasks, never to a run's."""
    door: Annotated[bool, PlatformGranted("model doors are granted by the platform only")] = False
    """May open a model door (one loopback port that leads to inference only, with a key the
    sandbox never sees). Granted by the platform to evaluation-job keys, never by a parent to a
    child: a key nobody minted with it cannot get it."""


def _op(method: str, path: str, name: str, **kw: Any) -> Operation:
    return Operation(method, path, name, concurrency=False, **kw)


_DAEMON = dict(auth="sandbox_token")


def _create_defaults(body: dict[str, Any], config: GymConfig) -> dict[str, Any]:
    """What a create that leaves these out gets (services/sandbox/service.py)."""
    return {"timeout": config.sandbox.default_timeout_s, "templateID": config.sandbox.default_template}


SPEC = ServiceSpec(
    name="sandbox",
    operations=(
        _op("POST", "/sandboxes", "sandboxes.create", json_body=True, schema=CreateSandbox, defaults=_create_defaults),
        _op("POST", "/v2/sandboxes", "sandboxes.create", json_body=True, schema=CreateSandbox,
            defaults=_create_defaults),
        _op("POST", "/v2/templates", "templates.build", body_limit="files"),
        _op("GET", "/templates", "templates.list"),
        _op("GET", "/v2/templates", "templates.list"),
        _op("GET", "/sandboxes", "sandboxes.list"),
        _op("GET", "/v2/sandboxes", "sandboxes.list"),
        _op("GET", "/sandboxes/{id}", "sandboxes.get"),
        _op("DELETE", "/sandboxes/{id}", "sandboxes.kill"),
        _op("POST", "/sandboxes/{id}/timeout", "sandboxes.timeout"),
        _op("POST", "/sandboxes/{id}/connect", "sandboxes.connect"),
        _op("POST", "/v2/sandboxes/{id}/connect", "sandboxes.connect"),
        _op("PUT", "/sandboxes/{id}/network", "sandboxes.network"),
        _op("POST", "/sandboxes/{id}/pause", "sandboxes.pause"),
        _op("POST", "/sandboxes/{id}/resume", "sandboxes.resume"),
        _op("GET", "/v1/sandboxes", "records.list"),
        _op("GET", "/v1/sandboxes/{id}", "records.get"),
        _op("GET", "/envd/health", "envd.health", **_DAEMON),
        _op("GET", "/envd/files", "envd.files.read", **_DAEMON),
        _op("POST", "/envd/files", "envd.files.write", body_limit="files", **_DAEMON),
        _op("POST", "/envd/process.Process/{method}", "envd.process", **_DAEMON),
        _op("POST", "/envd/filesystem.Filesystem/{method}", "envd.filesystem", **_DAEMON),
    ),
    operator_operations=(
        Operation("POST", "/operator/runs/{run_id}/end", "operator.runs.end"),
    ),
    policy=SandboxPolicy,
)
