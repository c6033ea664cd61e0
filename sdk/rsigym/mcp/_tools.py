"""What every tool group shares: registering a tool under its group's prefix, dumping the SDK's
answers as JSON objects, and turning a refusal from the gym into an MCP error result.

A tool is a plain (blocking) function over the SDK's :class:`~rsigym.Gym`; the MCP server runs
it on a worker thread. Its answer is a JSON object: a model's ``model_dump(mode="json")``, a list
as ``{"object": "list", "data": [...]}`` (the HTTP API's own list shape), plus ``billing`` — what
the gateway's headers said the call cost and what the run has left — when they said it.

A gym error (any 4xx/5xx in the gateway's ``{"error": {"type", "message", "param"}}`` shape) is
returned, not raised: an ``isError`` result whose JSON is ``{"error": {"type", "message",
"param", "status", "request_id"}}``, so the agent reads the same refusal the HTTP API gives.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel

from .._response import ResponseMeta
from ..errors import APIStatusError, RSIGymError

__all__ = ["Result", "ToolRegistrar", "dump", "error_result"]

Result = dict[str, Any]
"""What a tool returns (its structured content); an error comes back as a ``CallToolResult``."""

F = TypeVar("F", bound=Callable[..., Any])


def _billing(obj: object) -> dict[str, Any] | None:
    meta = getattr(obj, "_meta", None)
    if not isinstance(meta, ResponseMeta) or (meta.cost_usd is None and meta.remaining_usd is None):
        return None
    return {"cost_usd": meta.cost_usd, "remaining_usd": meta.remaining_usd, "request_id": meta.request_id}


def _plain(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def dump(obj: Any, **extra: Any) -> Result:
    """An SDK answer as a JSON object (``extra`` keys added alongside)."""
    if isinstance(obj, list):
        body: Result = {"object": "list", "data": [_plain(item) for item in obj]}
    elif isinstance(obj, BaseModel):
        body = obj.model_dump(mode="json")
    else:
        body = {"result": obj}
    body.update(extra)
    billing = _billing(obj)
    if billing is not None:
        body["billing"] = billing
    return body


def error_result(error: RSIGymError | ValueError | OSError) -> CallToolResult:
    """The ``isError`` result for a refusal (``status`` is None when no HTTP answer came)."""
    if isinstance(error, APIStatusError):
        body = {"type": error.type, "message": error.message, "param": error.param,
                "status": error.status_code, "request_id": error.request_id}
    elif isinstance(error, RSIGymError):  # no answer (connection, timeout) or one the SDK cannot parse
        body = {"type": error.type, "message": error.message, "param": None, "status": None,
                "request_id": error.request_id}
    else:  # a bad argument caught before any request (an empty id, an unreadable file)
        body = {"type": "invalid_request_error", "message": str(error), "param": None, "status": None,
                "request_id": None}
    content = {"error": body}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(content))],
                          structured_content=content, is_error=True)


class ToolRegistrar:
    """Registers one group's tools on the server as ``<group>_<name>``."""

    def __init__(self, server: MCPServer, group: str) -> None:
        self.server = server
        self.group = group

    def __call__(self, name: str, description: str, *, read_only: bool = False, destructive: bool = False,
                 idempotent: bool = False) -> Callable[[F], F]:
        """Decorator: ``description`` is the one line the agent reads (what it does, what it costs)."""

        def decorator(fn: F) -> F:
            @functools.wraps(fn)  # the server reads the arguments' schema from ``fn``'s signature
            def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    return fn(*args, **kwargs)
                except (RSIGymError, ValueError, OSError) as error:
                    return error_result(error)

            annotations = ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive,
                                          idempotent_hint=idempotent or read_only, open_world_hint=False)
            self.server.add_tool(call, name=f"{self.group}_{name}", description=description,
                                 annotations=annotations)
            return fn

        return decorator

