"""The research agent's trajectory: every call it made to its own model through the gym's
agent route (``/agent/v1/…``), kept by the platform as it happened.

A row holds what the agent sent and what came back (for a stream: the assembled text and
tool calls), the provider's usage and the cost charged on the run's agent-model meter. The
operator reads it (``GET /admin/v1/runs/{run}/trajectory``) and the audits' behaviour check
judges it (services/records/audits/run.py). Rows are bounded, so one huge prompt cannot grow
the store without limit: a request longer than :data:`MAX_FIELD_CHARS` of JSON first loses what
every turn repeats — tool definitions are kept by name, the oldest messages of the conversation
(earlier turns hold them) are dropped — so that what the agent sent last stays readable (a coding
CLI's requests are 50–100 kB, most of it tool schemas); whatever is still too long is stored as its
head. Either way ``truncated`` is set; the cost and usage are always exact.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from functools import partial
from typing import Any, Literal

import anyio
from sqlalchemy import JSON, BigInteger, Boolean, CheckConstraint, Integer, String, select
from sqlalchemy.orm import Mapped, mapped_column

from billing.money import nusd_to_usd
from kit.display_text import inert
from kit.identity import Identity
from storage.store import Store
from storage.tables import Base, UTCDateTime, utcnow

_log = logging.getLogger("rsigym.agent_turns")

MAX_FIELD_CHARS = 64 * 1024
"""Most characters of JSON kept of one turn's request or response."""
MAX_RENDER_CHARS = 4000
"""Most characters of one message shown per turn in the text rendering (the audit's judge)."""

Api = Literal["openai", "anthropic", "responses"]
"""The API a turn was made in: OpenAI chat completions, Anthropic Messages, OpenAI Responses."""


class AgentTurn(Base):
    __tablename__ = "agent_turns"
    __table_args__ = (CheckConstraint("api IN ('openai', 'anthropic', 'responses')", name="api_known"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    """Store-wide order of turns (a run's turns are its rows in ``seq`` order)."""
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    key_id: Mapped[str] = mapped_column(String(40))
    """The key that made the call (the run key or one of its children)."""
    request_id: Mapped[str | None] = mapped_column(String(64))
    api: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(200))
    stream: Mapped[bool] = mapped_column(Boolean)
    request: Mapped[Any] = mapped_column(JSON)
    response: Mapped[Any] = mapped_column(JSON)
    usage: Mapped[dict[str, Any]] = mapped_column(JSON)
    cost_nusd: Mapped[int] = mapped_column(BigInteger)
    truncated: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


def _chars(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))


def _tool_name(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return tool
    return tool.get("name") or (tool.get("function") or {}).get("name") or tool.get("type")


def _slimmed(value: dict[str, Any], chars: int) -> dict[str, Any]:
    """``value`` without what every turn repeats: tools by name, then the oldest conversation items
    while it is too long (the newest always stays)."""
    slim = dict(value)
    if isinstance(slim.get("tools"), list):
        slim["tools"] = [_tool_name(t) for t in slim["tools"]]
    for key in ("messages", "input"):
        items = slim.get(key)
        if not isinstance(items, list) or len(items) < 2:
            continue
        sizes = [_chars(item) + 1 for item in items]
        total, start = _chars(slim), 0
        while start < len(items) - 1 and total > chars:
            total -= sizes[start]
            start += 1
        if start:
            slim[key] = items[start:]
            slim[f"{key}_dropped"] = start
    return slim


def bounded(value: Any) -> tuple[Any, bool]:
    """``value``, or what fits of it when its JSON is longer than the bound (see the module's
    docstring): (stored value, truncated?)."""
    chars = _chars(value)
    if chars <= MAX_FIELD_CHARS:
        return value, False
    if isinstance(value, dict):
        slim = _slimmed(value, MAX_FIELD_CHARS - 64)
        if _chars(slim) <= MAX_FIELD_CHARS - 64:
            return {**slim, "truncated": True, "chars": chars}, True
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return {"truncated": True, "chars": chars, "head": text[:MAX_FIELD_CHARS]}, True


def record_turn(store: Store, *, run_id: str, key_id: str, request_id: str | None, api: Api, model: str,
                stream: bool, request: Any, response: Any, usage: dict[str, Any], cost_nusd: int) -> None:
    stored_request, cut_request = bounded(request)
    stored_response, cut_response = bounded(response)
    with store.transaction() as s:
        s.add(AgentTurn(run_id=run_id, key_id=key_id, request_id=request_id, api=api, model=model, stream=stream,
                        request=stored_request, response=stored_response, usage=usage, cost_nusd=cost_nusd,
                        truncated=cut_request or cut_response, created_at=utcnow()))


def turn_view(row: AgentTurn) -> dict[str, Any]:
    return {"seq": row.seq, "run_id": row.run_id, "key_id": row.key_id, "request_id": row.request_id,
            "api": row.api, "model": row.model, "stream": row.stream, "request": row.request,
            "response": row.response, "usage": row.usage, "cost_usd": nusd_to_usd(row.cost_nusd),
            "truncated": row.truncated, "created_at": row.created_at.isoformat()}


def run_turns(store: Store, run_id: str, *, limit: int = 10_000) -> list[dict[str, Any]]:
    with store.transaction() as s:
        rows = s.scalars(select(AgentTurn).where(AgentTurn.run_id == run_id).order_by(AgentTurn.seq).limit(limit))
        return [turn_view(r) for r in rows]


def _clip(text: str) -> str:
    """At most :data:`MAX_RENDER_CHARS`, and inert (kit/display_text.py): what the agent's tools
    printed — shell output included — is read by the judge and by an operator's terminal, so a
    control sequence in it is shown escaped, never acted on."""
    clipped = text if len(text) <= MAX_RENDER_CHARS else (
        text[:MAX_RENDER_CHARS] + f" […{len(text) - MAX_RENDER_CHARS} more chars]")
    return inert(clipped, lines=True)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_content_text(part.get("text") or part.get("input") or part.get("content") or "")
                        if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _conversation(request: dict[str, Any]) -> list[Any]:
    """A request's messages: chat's and Messages' ``messages``, or a Responses ``input`` (a string
    is one user message; a tool result item reads as a ``tool`` message)."""
    if "messages" in request:
        return list(request.get("messages") or [])
    given = request.get("input")
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    out: list[Any] = []
    for item in given or []:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            out.append({"role": "tool", "content": item.get("output")})
        elif isinstance(item, dict) and item.get("type") == "function_call":
            out.append({"role": "assistant", "content": f"{item.get('name')}({item.get('arguments')})"})
        else:
            out.append(item)
    return out


def render_text(turns: list[dict[str, Any]]) -> str:
    """The trajectory as plain text for a reader (the behaviour check's judge): per turn, the
    newest message the agent sent and the model's answer."""
    lines: list[str] = []
    for t in turns:
        request, response = t["request"] if isinstance(t["request"], dict) else {}, t["response"]
        messages = _conversation(request)
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        lines.append(f"## turn {t['seq']} ({t['api']}, model {t['model']}, {t['created_at']})")
        system = request.get("system") if "system" in request else request.get("instructions")
        if isinstance(system, (str, list)) and len(messages) <= 1:
            lines.append(f"[system] {_clip(_content_text(system))}")
        lines.append(f"[{last.get('role', 'user')}] {_clip(_content_text(last.get('content')))}")
        lines.append(f"[model] {_clip(_content_text(response.get('text') if isinstance(response, dict) else response))}")
        calls = response.get("tool_calls") if isinstance(response, dict) else None
        if calls:
            lines.append(f"[model tool calls] {_clip(json.dumps(calls, ensure_ascii=False))}")
    return "\n".join(lines)


def usage_tokens(usage: dict[str, Any]) -> dict[str, Any]:
    """The token counts a turn keeps of an OpenAI ``usage``."""
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens") if k in usage}


def completion_summary(completion: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat completion's response as the trajectory keeps it: text, tool calls, finish reason."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    calls = [{"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
              "arguments": (c.get("function") or {}).get("arguments")} for c in message.get("tool_calls") or []]
    return {"text": message.get("content") or "", "tool_calls": calls, "finish_reason": choice.get("finish_reason")}


async def record_served_turn(store: Store, identity: Identity, api: Api, request: dict[str, Any],
                             response: dict[str, Any], usage: dict[str, Any], cost_nusd: int, *, stream: bool) -> None:
    """Keep a served agent-route turn (the rollout service's catalogue models and the gym's own,
    services/inference/agent.py), charged at most its reservation; shielded from the caller's
    cancellation, and a store failure logged, never raised: the call was served and billed."""
    charged = min(cost_nusd, identity.estimate_nusd) if identity.reservation_id else cost_nusd
    record = partial(record_turn, store, run_id=identity.run_id, key_id=identity.caller_key_id or identity.key_id,
                     request_id=identity.request_id, api=api, model=str(request.get("model")), stream=stream,
                     request=request, response=response, usage=usage_tokens(usage), cost_nusd=charged)
    with anyio.CancelScope(shield=True):
        try:
            await anyio.to_thread.run_sync(record)
        except Exception as err:  # noqa: BLE001 - the call was served and billed; its record is logged as lost
            _log.error("%s: agent turn of run %s not recorded: %s", identity.request_id, identity.run_id,
                       type(err).__name__)
