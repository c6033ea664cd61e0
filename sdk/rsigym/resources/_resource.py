"""Base classes of the resources hung on :class:`~rsigym.Gym` / :class:`~rsigym.AsyncGym`.

A service is added in three steps: module-level functions that build each
:class:`~rsigym._base_client.APICall`, a sync resource whose methods run them with
``self._client._request`` / ``_stream``, and an async twin that awaits the same calls.
The twins are one-liners per method; the request logic exists once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from .._base_client import AsyncAPIClient, SyncAPIClient


class SyncResource:
    def __init__(self, client: SyncAPIClient) -> None:
        self._client = client


class AsyncResource:
    def __init__(self, client: AsyncAPIClient) -> None:
        self._client = client


def path_id(value: str) -> str:
    """Quote an id for use as one path segment (so ``"../x"`` cannot change the route)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty id string, got {value!r}")
    return quote(value, safe="")


def drop_none(mapping: dict[str, object]) -> dict[str, object]:
    """Leave unset optional parameters out of a request body instead of sending nulls."""
    return {key: value for key, value in mapping.items() if value is not None}
