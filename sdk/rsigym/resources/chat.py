"""OpenAI-compatible surfaces (``/<service>/v1/models`` and ``/chat/completions``).

Rollout serves them today; inference serves the same shapes under ``/inference/v1``, so
it will be ``class Inference(OpenAICompatible): _prefix = "/inference/v1"`` (and its
async twin), with no new request code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal, overload

from pydantic import BaseModel

from .._base_client import APICall
from .._response import ObjectList, parse_list, parse_object
from .._streaming import AsyncStream, Stream
from ..types import ChatCompletion, ChatCompletionChunk, Model
from ._resource import AsyncResource, SyncResource, drop_none

Message = Mapping[str, Any] | BaseModel


def _message_dicts(messages: Iterable[Message]) -> list[dict[str, Any]]:
    if isinstance(messages, str | bytes | Mapping):
        raise TypeError('messages must be a list of messages, e.g. [{"role": "user", "content": "hi"}]')
    out = []
    for message in messages:
        if isinstance(message, BaseModel):
            out.append(message.model_dump(exclude_none=True))
        elif isinstance(message, Mapping):
            out.append(dict(message))
        else:
            raise TypeError(f"each message must be a dict or a pydantic model, got {type(message).__name__}")
    return out


def models_call(prefix: str) -> APICall[ObjectList[Model]]:
    return APICall("GET", f"{prefix}/models", parse_list(Model))


def chat_call(
    prefix: str, *, model: str, messages: Iterable[Message], stream: bool, params: Mapping[str, Any]
) -> APICall[ChatCompletion]:
    """``params`` are passed through as OpenAI parameters (``max_tokens``, ``temperature``,
    ``stop``, …); those set to ``None`` are left out."""
    body: dict[str, Any] = {"model": model, "messages": _message_dicts(messages), **drop_none(dict(params))}
    if stream:
        body["stream"] = True
    return APICall("POST", f"{prefix}/chat/completions", parse_object(ChatCompletion), json=body)


class OpenAICompatible(SyncResource):
    _prefix: ClassVar[str]

    def models(self) -> ObjectList[Model]:
        """The models this service serves, with their prices when the gym publishes them."""
        return self._client._request(models_call(self._prefix))

    @overload
    def chat(
        self, *, model: str, messages: Iterable[Message], stream: Literal[False] = False, **params: Any
    ) -> ChatCompletion: ...
    @overload
    def chat(
        self, *, model: str, messages: Iterable[Message], stream: Literal[True], **params: Any
    ) -> Stream[ChatCompletionChunk]: ...
    def chat(
        self, *, model: str, messages: Iterable[Message], stream: bool = False, **params: Any
    ) -> ChatCompletion | Stream[ChatCompletionChunk]:
        """Create a chat completion; with ``stream=True`` return a :class:`~rsigym.Stream` of chunks."""
        call = chat_call(self._prefix, model=model, messages=messages, stream=stream, params=params)
        if stream:
            return self._client._stream(call, ChatCompletionChunk)
        return self._client._request(call)


class AsyncOpenAICompatible(AsyncResource):
    _prefix: ClassVar[str]

    async def models(self) -> ObjectList[Model]:
        return await self._client._request(models_call(self._prefix))

    @overload
    async def chat(
        self, *, model: str, messages: Iterable[Message], stream: Literal[False] = False, **params: Any
    ) -> ChatCompletion: ...
    @overload
    async def chat(
        self, *, model: str, messages: Iterable[Message], stream: Literal[True], **params: Any
    ) -> AsyncStream[ChatCompletionChunk]: ...
    async def chat(
        self, *, model: str, messages: Iterable[Message], stream: bool = False, **params: Any
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        call = chat_call(self._prefix, model=model, messages=messages, stream=stream, params=params)
        if stream:
            return await self._client._stream(call, ChatCompletionChunk)
        return await self._client._request(call)


class Rollout(OpenAICompatible):
    """``gym.rollout``: frontier / teacher models behind the gateway (LiteLLM catalogue)."""

    _prefix = "/rollout/v1"


class AsyncRollout(AsyncOpenAICompatible):
    _prefix = "/rollout/v1"


class Inference(OpenAICompatible):
    """Base models and the run's own checkpoints (``model="ckpt_…"``)."""

    _prefix = "/inference/v1"


class AsyncInference(AsyncOpenAICompatible):
    _prefix = "/inference/v1"
