"""Client configuration: the only place in the SDK that reads the environment.

An agent container gets two variables and nothing else: ``RSIGYM_URL`` (where the
gateway listens) and ``RSIGYM_API_KEY`` (its per-run key).  Explicit arguments
to :class:`~rsigym.Gym` always win over the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_BASE_URL = "http://127.0.0.1:8700"
ENV_URL = "RSIGYM_URL"
ENV_API_KEY = "RSIGYM_API_KEY"


@dataclass(frozen=True, slots=True)
class ClientConfig:
    base_url: str
    api_key: str | None

    def __repr__(self) -> str:  # never print the key
        return f"ClientConfig(base_url={self.base_url!r}, api_key={'***' if self.api_key else None})"


def resolve_config(
    base_url: str | None = None,
    api_key: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClientConfig:
    """Merge explicit arguments with the environment; empty strings count as unset."""
    env = os.environ if environ is None else environ
    url = (base_url or env.get(ENV_URL, "").strip() or DEFAULT_BASE_URL).rstrip("/")
    key = (api_key or env.get(ENV_API_KEY, "")).strip() or None
    return ClientConfig(base_url=url, api_key=key)
