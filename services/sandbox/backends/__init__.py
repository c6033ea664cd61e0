"""Sandbox backends, chosen by ``[sandbox] backend`` through one registry.

Each factory imports its backend when called: the local backend needs Linux namespaces,
the E2B one the ``e2b`` SDK; neither is imported by the gateway or the spec modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kit.backends import Registry

if TYPE_CHECKING:
    from kit.spec import ServiceContext
    from services.sandbox.backends.base import SandboxBackend

SandboxFactory = Callable[["ServiceContext"], "SandboxBackend"]
SANDBOX_BACKENDS: Registry[SandboxFactory] = Registry("sandbox")


@SANDBOX_BACKENDS.register("local")
def make_local(context: ServiceContext) -> SandboxBackend:
    from services.sandbox.backends.local import LocalBackend

    cfg = context.config.sandbox
    return LocalBackend(cfg.local_root, cfg.uid_base, scratch=context.settings.resolved_scratch_dir(),
                        warm_pool=cfg.warm_pool)


@SANDBOX_BACKENDS.register("e2b")
def make_e2b(context: ServiceContext) -> SandboxBackend:
    from services.sandbox.backends.e2b_cloud import E2BCloudBackend

    return E2BCloudBackend.from_context(context)
