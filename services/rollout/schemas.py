"""Request schema of the OpenAI-compatible rollout endpoint.

The gym re-serializes every request from this schema before it reaches LiteLLM, so a field
that is not declared here never reaches a provider. Anything that would make the provider
fetch or look up something on its own — web search, remote URLs, stored files, non-function
tools — is refused with 403 before any money is reserved.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kit.errors import PermissionDenied, Unprocessable, parsed_request

FETCHING_FIELDS = {
    "web_search_options": "web search",
    "file_ids": "stored files",
    "attachments": "stored files",
    "functions": "legacy functions (use tools)",
    "prediction": "predicted outputs",
    "audio": "audio output",
    "modalities": "non-text output",
    "store": "provider-side storage",
    "metadata": "provider-side storage",
    "extra_body": "provider pass-through",
    "extra_headers": "provider pass-through",
    "api_base": "provider routing",
    "base_url": "provider routing",
    "api_key": "provider credentials",
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class Message(BaseModel):
    # Unknown per-message keys (e.g. "refusal": null echoed back by SDKs) are dropped, never forwarded.
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


_NOT_SAMPLING = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens"}


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int = Field(default=1, ge=1, le=8)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    user: str | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def sampling_params(self) -> dict[str, Any]:
        """Everything but model/messages/stream/token caps, ready for LiteLLM."""
        return self.model_dump(exclude_none=True, exclude=_NOT_SAMPLING)  # the messages are not dumped to be dropped

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


def refuse_fetching(body: dict[str, Any]) -> None:
    """403 for anything that would make the provider reach out on the agent's behalf."""
    for name, what in FETCHING_FIELDS.items():
        if name in body:
            raise PermissionDenied(f"{name} is refused: the gym does not let providers use {what}", param=name)
    for i, tool in enumerate(_listed(body.get("tools"))):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise PermissionDenied(f"tool type {kind!r} is refused: only function tools", param=f"tools.{i}.type")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text", "json_object", "json_schema"):
        raise PermissionDenied("response_format type is refused", param="response_format.type")
    for i, message in enumerate(_listed(body.get("messages"))):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                _check_part(part, f"messages.{i}.content.{j}")


def _listed(value: Any) -> list[Any]:
    """``value`` when it is a list, else nothing to check here (the schema refuses it with a 422)."""
    return value if isinstance(value, list) else []


def _check_part(part: Any, where: str) -> None:
    if not isinstance(part, dict):
        raise Unprocessable("a content part must be an object", param=where)
    kind = part.get("type")
    if kind == "text":
        return
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if isinstance(url, str) and url.startswith("data:"):
            return
        raise PermissionDenied("remote image URLs are refused; send the image inline as a data: URL", param=where)
    if kind == "input_audio":
        return
    if kind == "file":
        file = part.get("file")
        if isinstance(file, dict) and "file_id" not in file and isinstance(file.get("file_data"), str) and file[
            "file_data"
        ].startswith("data:"):
            return
        raise PermissionDenied("file references are refused; send file contents inline", param=where)
    raise PermissionDenied(f"content part type {kind!r} is refused", param=where)


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    refuse_fetching(body)
    return parsed_request(ChatRequest, body)


CHAT_SYNONYMS = {"max_completion_tokens": "max_tokens"}
"""OpenAI names one cap twice; the gateway rewrites the newer name to ``max_tokens`` before any
policy rule sees the body (kit/canonical.py), so a rule on one cannot be dodged by
the other."""
