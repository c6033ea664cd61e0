"""Server-sent events: a byte-level decoder and the stream objects built on it.

The gateway streams OpenAI-style chat chunks as ``data: {json}\\n\\n`` events and ends
with ``data: [DONE]``. Lines starting with ``:`` are keep-alive comments. An error that
happens after the stream started arrives as an event whose JSON is the standard error
body (or whose ``event:`` field is ``error``) and is raised as the matching
:class:`~rsigym.errors.APIStatusError` subclass.

All parsing lives in :class:`SSEDecoder` and :class:`_ChunkParser`; :class:`Stream` and
:class:`AsyncStream` only differ in how they read bytes from the response.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx
import pydantic

from ._response import HasMeta, ResponseMeta
from .errors import APIResponseValidationError, error_from_body, error_from_transport

__all__ = ["ServerSentEvent", "SSEDecoder", "Stream", "AsyncStream"]

T = TypeVar("T", bound=pydantic.BaseModel)

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental SSE decoder (WHATWG rules) fed raw bytes in arbitrary pieces.

    Bytes are split into lines before decoding, so a UTF-8 character or a ``\\r\\n``
    cut between two network reads is handled.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        if not self._started and chunk:
            self._started = True
            chunk = chunk.removeprefix(_BOM)
        self._buffer += chunk
        events: list[ServerSentEvent] = []
        pos = 0
        while (match := _EOL.search(self._buffer, pos)) is not None:
            if match.group() == b"\r" and match.end() == len(self._buffer):
                break  # may be the first half of a \r\n split across reads
            event = self._line(self._buffer[pos : match.start()].decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            pos = match.end()
        self._buffer = self._buffer[pos:]
        return events

    def flush(self) -> list[ServerSentEvent]:
        """End of input: finish the last line and dispatch an event left without its blank line."""
        events = []
        if self._buffer:
            events = self.feed(b"\n")
        if self._data:
            events.append(self._dispatch())
        return [event for event in events if event is not None]

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:  # blank line: end of an event (one without data is dropped)
            if self._data:
                return self._dispatch()
            self._reset()
            return None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value or None
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def _reset(self) -> None:
        self._data, self._event, self._retry = [], None, None

    def _dispatch(self) -> ServerSentEvent:
        event = ServerSentEvent(data="\n".join(self._data), event=self._event, id=self._id, retry=self._retry)
        self._reset()
        return event


class _ChunkParser(Generic[T]):
    """Turns response bytes into validated chunks; shared by the sync and async streams."""

    def __init__(self, item_type: type[T], response: httpx.Response) -> None:
        self._item_type = item_type
        self._response = response
        self._decoder = SSEDecoder()
        self.done = False
        self.last_usage: Any = None

    def feed(self, data: bytes) -> Iterator[T]:
        return self._items(self._decoder.feed(data))

    def finish(self) -> Iterator[T]:
        return self._items(self._decoder.flush())

    def _items(self, events: list[ServerSentEvent]) -> Iterator[T]:
        """Chunks one by one, so those before an error event still reach the caller."""
        for event in events:
            if self.done:
                return
            if event.data.strip() == "[DONE]":
                self.done = True
                return
            item = self._parse(event)
            if getattr(item, "usage", None) is not None:
                self.last_usage = item.usage  # type: ignore[attr-defined]
            yield item

    def _parse(self, event: ServerSentEvent) -> T:
        try:
            payload = json.loads(event.data)
        except ValueError as exc:
            raise APIResponseValidationError(
                f"stream event is not JSON: {event.data[:200]!r}", response=self._response
            ) from exc
        is_error = event.event == "error" or (
            isinstance(payload, dict) and (payload.get("type") == "error" or "error" in payload)
        )
        if is_error:
            self.done = True
            raise error_from_body(payload, self._response)
        try:
            return self._item_type.model_validate(payload)
        except pydantic.ValidationError as exc:
            raise APIResponseValidationError(f"unexpected stream chunk: {exc}", response=self._response) from exc


class _StreamBase(HasMeta, Generic[T]):
    """Metadata shared by both streams.

    The headers arrive before the first chunk, when the call has only been *reserved*:
    for a stream the gateway sends its worst-case cost in ``X-RSIGym-Cost-USD`` (marked
    ``X-RSIGym-Cost-Kind: reserved-upper-bound``) and the remaining budget after that
    hold. The exact cost comes in the final chunk's ``usage.cost_usd`` when the request
    asked for it with ``stream_options={"include_usage": True}``; once that chunk has
    been read, ``cost_usd`` returns it and ``cost_is_upper_bound`` turns False.
    """

    def __init__(self, response: httpx.Response, item_type: type[T]) -> None:
        self.response = response
        self._meta = ResponseMeta.from_response(response)
        self._parser: _ChunkParser[T] = _ChunkParser(item_type, response)

    @property
    def usage(self) -> Any:
        """The last ``usage`` object seen in the stream (None until the server sends one)."""
        return self._parser.last_usage

    @property
    def _usage_cost(self) -> float | None:
        cost = getattr(self._parser.last_usage, "cost_usd", None)
        return cost if isinstance(cost, int | float) else None

    @property
    def cost_usd(self) -> float | None:
        """Exact cost from the stream's usage once seen, else the cost header."""
        usage_cost = self._usage_cost
        return usage_cost if usage_cost is not None else self._meta.cost_usd

    @property
    def cost_is_upper_bound(self) -> bool:
        """True while ``cost_usd`` is only the gateway's reservation for this stream."""
        return self._usage_cost is None and self._meta.cost_kind == "reserved-upper-bound"


class Stream(_StreamBase[T]):
    """Iterator of chunks from a streamed response. Close it (or use ``with``) when
    stopping early; it closes itself once exhausted."""

    def __init__(self, response: httpx.Response, item_type: type[T]) -> None:
        super().__init__(response, item_type)
        self._iterator = self._iterate()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        return next(self._iterator)

    def _iterate(self) -> Iterator[T]:
        try:
            for data in self.response.iter_bytes():
                yield from self._parser.feed(data)
                if self._parser.done:
                    return
            yield from self._parser.finish()
        except httpx.TransportError as exc:
            raise error_from_transport(exc) from exc
        finally:
            self.close()

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncStream(_StreamBase[T]):
    """Async iterator of chunks from a streamed response; ``await stream.close()`` or
    ``async with`` when stopping early."""

    def __init__(self, response: httpx.Response, item_type: type[T]) -> None:
        super().__init__(response, item_type)
        self._iterator = self._iterate()

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        return await self._iterator.__anext__()

    async def _iterate(self) -> AsyncIterator[T]:
        try:
            async for data in self.response.aiter_bytes():
                for item in self._parser.feed(data):
                    yield item
                if self._parser.done:
                    return
            for item in self._parser.finish():
                yield item
        except httpx.TransportError as exc:
            raise error_from_transport(exc) from exc
        finally:
            await self.close()

    async def close(self) -> None:
        await self.response.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
