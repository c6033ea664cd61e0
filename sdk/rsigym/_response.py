"""Response metadata and the helpers that turn an ``httpx.Response`` into SDK objects.

Every answer the SDK returns remembers three facts from its HTTP response:

* ``request_id``    – ``X-Request-Id`` (quote it when reporting a problem),
* ``cost_usd``      – ``X-RSIGym-Cost-USD``, what this call was charged,
* ``remaining_usd`` – ``X-RSIGym-Remaining-USD``, the run's budget left after it.

They live in one :class:`ResponseMeta`. Pydantic models hold it in a private
attribute (so it never appears in ``model_dump()`` or equality of the data), lists
are :class:`ObjectList` (a ``list`` with the same three attributes), and streams
expose the same attributes directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx
import pydantic

from .errors import APIResponseValidationError

__all__ = ["ResponseMeta", "ObjectList", "HasMeta", "HasRequestMeta", "parse_object", "parse_list"]

REQUEST_ID_HEADER = "x-request-id"
COST_HEADER = "x-rsigym-cost-usd"
REMAINING_HEADER = "x-rsigym-remaining-usd"
COST_KIND_HEADER = "x-rsigym-cost-kind"  # "reserved-upper-bound" on streams: the exact cost comes at the end


def _header_float(headers: httpx.Headers, name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    request_id: str | None = None
    cost_usd: float | None = None
    remaining_usd: float | None = None
    cost_kind: str | None = None
    status_code: int | None = None

    @classmethod
    def from_response(cls, response: httpx.Response) -> ResponseMeta:
        headers = response.headers
        return cls(
            request_id=headers.get(REQUEST_ID_HEADER),
            cost_usd=_header_float(headers, COST_HEADER),
            remaining_usd=_header_float(headers, REMAINING_HEADER),
            cost_kind=headers.get(COST_KIND_HEADER),
            status_code=response.status_code,
        )


class HasRequestMeta:
    """Mixin: read-only ``request_id`` / ``cost_usd`` from ``self._meta``.

    The class using it must set ``self._meta`` (pydantic models declare it as a
    ``PrivateAttr``); the mixin deliberately declares no annotation of its own so
    pydantic does not mistake it for a field.
    """

    if TYPE_CHECKING:
        _meta: ResponseMeta

    @property
    def request_id(self) -> str | None:
        return self._meta.request_id

    @property
    def cost_usd(self) -> float | None:
        return self._meta.cost_usd


class HasMeta(HasRequestMeta):
    """Mixin: ``request_id`` / ``cost_usd`` / ``remaining_usd`` from ``self._meta``."""

    @property
    def remaining_usd(self) -> float | None:
        return self._meta.remaining_usd


T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)


class ObjectList(HasMeta, list[T], Generic[T]):
    """A plain ``list`` of results that also carries the response metadata."""

    def __init__(self, items: Iterable[T] = (), meta: ResponseMeta | None = None) -> None:
        super().__init__(items)
        self._meta = meta or ResponseMeta()


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise APIResponseValidationError(
            f"expected a JSON body from {response.request.method} {response.request.url.path}, "
            f"got {response.headers.get('content-type', 'no content type')}",
            response=response,
        ) from exc


def _validate(model: type[M], data: Any, response: httpx.Response) -> M:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise APIResponseValidationError(
            f"unexpected {model.__name__} from {response.request.url.path}: {exc}", response=response
        ) from exc


def parse_object(model: type[M]) -> Callable[[httpx.Response], M]:
    """Parser for an endpoint that answers one JSON object."""

    def parse(response: httpx.Response) -> M:
        obj = _validate(model, _json(response), response)
        if isinstance(obj, HasRequestMeta):
            obj._meta = ResponseMeta.from_response(response)
        return obj

    return parse


def parse_list(model: type[M]) -> Callable[[httpx.Response], ObjectList[M]]:
    """Parser for ``{"object": "list", "data": [...]}`` (a bare JSON array is accepted too)."""

    def parse(response: httpx.Response) -> ObjectList[M]:
        body = _json(response)
        items = body.get("data") if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise APIResponseValidationError(
                f"expected a list under 'data' from {response.request.url.path}", response=response
            )
        return ObjectList((_validate(model, item, response) for item in items), ResponseMeta.from_response(response))

    return parse
