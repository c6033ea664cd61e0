"""Tool use by category over time: what the research agent did, from two records.

* ``agent_tools``: the tool calls in its model's answers on the agent route (the trajectory),
  each put in a category by the tool's name (the gym's MCP tools, ``mcp__gym__execution_start_training``
  and the like, by what they call; a shell tool by the ``gym <service>`` command or ``/<service>/v1``
  path in its arguments, else ``local``: the agent's own tools in its namespace).
* ``platform_calls``: the run's metered calls, one ledger row each, by the service charged.

Both are counted in equal time bins over the run's research time (hours since it started)."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any

from ops.analyses.times import hours_since

CATEGORIES = ("training", "inference", "evaluation", "sandbox", "records", "local", "other")
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Ordered: the first rule whose word is in the name wins (``best_checkpoint`` reads records).
    ("records", ("experiment", "record", "review", "decision", "hypothes", "finding", "annotation", "event",
                 "lineage", "chain", "best_checkpoint", "diff")),
    ("sandbox", ("sandbox",)),
    ("training", ("train", "dataset", "checkpoint", "tinker", "loss")),
    ("evaluation", ("evaluat", "benchmark", "harness", "submi", "score")),
    ("inference", ("chat", "completion", "model", "rollout", "inference", "generate", "sample")),
)
LOCAL_TOOLS = frozenset({
    # Claude Code's and Codex's own tools: they act in the agent's namespace, not on the gym.
    "bash", "bashoutput", "killshell", "read", "write", "edit", "multiedit", "glob", "grep", "ls", "todowrite",
    "task", "webfetch", "websearch", "notebookedit", "exitplanmode", "shell", "exec_command", "write_stdin",
    "apply_patch", "update_plan", "view_image", "local_shell",
})
_SERVICE_IN_COMMAND = re.compile(r"\bgym\s+(training|inference|rollout|evaluation|sandbox|records)\b"
                                 r"|/(training|inference|rollout|evaluation|sandbox|records|tinker)/")
_SERVICE_CATEGORY = {"rollout": "inference", "tinker": "training"}


def category(name: str | None, arguments: Any = None) -> str:
    """The category of one tool call (:data:`CATEGORIES`)."""
    bare = (name or "").rsplit("__", 1)[-1].lower()  # mcp__gym__execution_start_training -> execution_start_training
    if bare in LOCAL_TOOLS:
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or "", default=str)
        found = _SERVICE_IN_COMMAND.search(text)
        if found:
            service = found.group(1) or found.group(2)
            return _SERVICE_CATEGORY.get(service, service)
        return "local"
    for cat, words in _RULES:
        if any(w in bare for w in words):
            return cat
    return "other"


def tool_calls(turns: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    """``(created_at, category)`` of every tool call in the trajectory's answers."""
    out: list[tuple[str | None, str]] = []
    for t in turns:
        response = t.get("response") if isinstance(t.get("response"), dict) else {}
        for call in (response or {}).get("tool_calls") or []:
            if isinstance(call, dict):
                out.append((t.get("created_at"), category(call.get("name"), call.get("arguments"))))
    return out


def ledger_calls(rows: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    """``(created_at, service)`` of every metered call (a ledger row)."""
    return [(r.get("created_at"), str(r.get("service") or "other")) for r in rows]


def binned(events: list[tuple[str | None, str]], start: datetime, bins: int = 12,
           span_hours: float | None = None) -> dict[str, Any]:
    """Counts per category in ``bins`` equal bins from the start to ``span_hours`` (default: the
    last event): ``{"bin_hours", "edges_hours", "counts": {category: [n, …]}, "totals"}``."""
    timed = [(h, c) for at, c in events if (h := hours_since(start, at)) is not None]
    span = span_hours if span_hours is not None else max((h for h, _ in timed), default=0.0)
    width = max(span, 1e-6) / bins
    counts: dict[str, list[int]] = {}
    for h, c in timed:
        i = min(bins - 1, max(0, math.floor(h / width)))
        counts.setdefault(c, [0] * bins)[i] += 1
    return {"bin_hours": width, "edges_hours": [round(i * width, 6) for i in range(bins + 1)],
            "counts": dict(sorted(counts.items())), "totals": {c: sum(v) for c, v in sorted(counts.items())}}


def tool_use(turns: list[dict[str, Any]], ledger: list[dict[str, Any]], start: datetime,
             bins: int = 12) -> dict[str, Any]:
    """Both series on one time axis (the later of the two records' last event)."""
    agent, platform = tool_calls(turns), ledger_calls(ledger)
    span = max((h for at, _ in agent + platform if (h := hours_since(start, at)) is not None), default=0.0)
    return {"agent_tools": binned(agent, start, bins, span), "platform_calls": binned(platform, start, bins, span)}
