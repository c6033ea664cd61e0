"""``rsigym watch RUN``: a live terminal view of one run, for the operator.

:func:`fetch_snapshot` reads everything through the admin API into one plain dict;
:func:`render` turns a snapshot into a rich renderable and is a pure function of it (the
stall check compares the snapshot's own ``now`` with its last agent call), so a frame can be
tested without a server; :func:`watch` loops the two under ``rich.live`` (or prints one frame
with ``once``).

Every string of a snapshot that an agent may have written (its turns, the names of what it made,
the errors the gym relays) is shown as plain text: control characters escaped, never Rich markup
(kit/display_text.py); ``--json`` prints the snapshot as it is.

A *stall* is no agent call at all — no turn on the agent route and no ledger row of the run's
keys (every service call reserves one) — for ``stall_minutes``. A run that has made no call
yet is measured from its creation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kit.display_text import PlainTable, inert, plain
from ops.cli.admin_client import AdminClient, AdminError

TURNS = 5
"""Agent turns shown."""
SCORES = 5
"""Finished evaluation jobs shown."""
CLIP = 100
"""Characters kept of a turn's last user message and of its answer."""


def _now() -> datetime:
    return datetime.now(UTC)


def _parse(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    at = datetime.fromisoformat(stamp)
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _text_of(content: Any) -> str:
    """Plain text of a message's content (a string, or OpenAI/Anthropic content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text_of(p.get("text") or p.get("content") or "") if isinstance(p, dict) else str(p)
                        for p in content)
    return "" if content is None else str(content)


def _answer_of(response: Any) -> str:
    """The model's answer as stored for a turn: the assembled ``text`` (streams), an OpenAI
    completion's first choice, or an Anthropic message's content."""
    if not isinstance(response, dict):
        return _text_of(response)
    if "text" in response:
        return _text_of(response["text"])
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return _text_of((choices[0].get("message") or {}).get("content"))
    return _text_of(response.get("content"))


def _clip(text: str, n: int = CLIP) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def turn_summary(turn: dict[str, Any]) -> dict[str, Any]:
    raw = turn.get("request")
    request: dict[str, Any] = raw if isinstance(raw, dict) else {}
    messages = [m for m in (request.get("messages") or []) if isinstance(m, dict)]
    users = [m for m in messages if m.get("role") == "user"]
    return {"at": turn.get("created_at"), "model": turn.get("model"), "cost_usd": turn.get("cost_usd"),
            "user": _clip(_text_of(users[-1].get("content") if users else None)),
            "answer": _clip(_answer_of(turn.get("response")))}


def _latest(*stamps: str | None) -> str | None:
    parsed = [(at, s) for s in stamps if (at := _parse(s)) is not None]
    return max(parsed)[1] if parsed else None


def fetch_snapshot(client: AdminClient, run_id: str, *, turns: int = TURNS, scores: int = SCORES) -> dict[str, Any]:
    """Everything one frame shows, read through the admin API. The run key itself must exist
    (an :class:`AdminError` otherwise); a part the gym cannot give (e.g. the records service is
    down) is left empty and named in ``errors``."""
    run = client.key(run_id)
    errors: list[str] = []

    def part(name: str, fetch: Callable[[], Any], empty: Any) -> Any:
        try:
            return fetch()
        except AdminError as err:
            errors.append(f"{name}: {err.type}: {err.message}")
            return empty

    timeline = part("timeline", lambda: client.timeline(run_id), {})
    meter = part("agent meter", lambda: client.key(run["agent_meter_id"]), None) if run.get("agent_meter_id") else None
    trajectory = part("trajectory", lambda: client.trajectory(run_id), [])
    ledger = part("ledger", lambda: client.ledger(run_id), [])
    jobs = part("jobs", lambda: client.run_jobs(run_id), [])
    finished = part("evaluation events", lambda: client.run_events(run_id, kind="evaluation.job"), [])
    audits = part("audits", lambda: client.audits(run_id), [])
    alerts = part("monitor alerts", lambda: client.alerts(run_id), [])
    integrity = part("integrity", lambda: client.integrity(run_id), None)
    last_turn = trajectory[-1]["created_at"] if trajectory else None
    last_ledger = _latest(*(r.get("created_at") for r in ledger))
    return {
        "now": _now().isoformat(),
        "run": {k: run.get(k) for k in ("id", "name", "track", "status", "state", "task", "agent", "agent_version",
                                        "agent_model", "budget_usd", "spent_usd", "reserved_usd", "remaining_usd",
                                        "unspent_usd", "created_at", "ends_at")},
        "spend_by_service": {svc: v.get("total_usd", 0.0) for svc, v in (timeline.get("spend_by_service") or {}).items()},
        "agent_model": None if meter is None else {k: meter.get(k) for k in ("id", "budget_usd", "spent_usd",
                                                                             "reserved_usd", "remaining_usd")},
        "storage": run.get("storage"),
        "turns": [turn_summary(t) for t in trajectory[-turns:]],
        "turn_count": len(trajectory),
        "jobs": jobs,
        "scores": [{"at": e["created_at"], **{k: e["data"].get(k) for k in ("job_id", "benchmark", "model", "harness",
                                                                            "purpose", "status", "score")}}
                   for e in finished if e["data"].get("status") in ("succeeded", "failed", "cancelled")][-scores:],
        "audit": None if not audits else {k: audits[0].get(k) for k in ("id", "status", "hacking_rate", "created_at")},
        "alerts": [{k: a.get(k) for k in ("id", "category", "code", "evidence", "judge_model", "turns", "paused",
                                           "created_at")} for a in alerts],
        "integrity": None if integrity is None else {k: v for k, v in integrity.items()
                                                     if k not in ("object", "run_id", "checks")},
        "last_agent_call_at": _latest(last_turn, last_ledger),
        "errors": errors,
    }


def _usd(value: float | None) -> str:
    """Dollars to the cent-hundredth; small sums (one cheap model call) to the nano-dollar."""
    if value is None:
        return "-"
    return f"${value:,.9f}" if 0 < abs(value) < 0.01 else f"${value:,.4f}"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def stall_seconds(snapshot: dict[str, Any]) -> float:
    """Seconds since the run's last agent call (since its creation when it has made none)."""
    now = _parse(snapshot["now"]) or _now()
    last = _parse(snapshot.get("last_agent_call_at")) or _parse(snapshot["run"].get("created_at")) or now
    return max(0.0, (now - last).total_seconds())


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _header(snapshot: dict[str, Any], stall_minutes: float) -> RenderableType:
    run = snapshot["run"]
    head = Text.assemble(("run ", "bold"), (inert(run.get("id")), "bold cyan"),
                         inert(f"  {run.get('name') or ''}  track {run.get('track') or '-'}  "
                               f"state {run.get('state') or run.get('status')}"))
    if run.get("agent"):
        head.append(inert(f"  agent {run['agent']} {run.get('agent_version') or ''}".rstrip()
                          + (f" ({run['agent_model']})" if run.get("agent_model") else "")))
    if run.get("ends_at"):
        head.append(inert(f"  ends {run['ends_at'][:19]}"))
    idle = stall_seconds(snapshot)
    last = snapshot.get("last_agent_call_at")
    lines: list[RenderableType] = [head, Text(f"at {snapshot['now'][:19]}  last agent call: "
                                              + (f"{_ago(idle)} ago" if last else "none yet"))]
    storage = snapshot.get("storage")
    if storage:
        used, quota = storage.get("used_bytes", 0), storage.get("quota_bytes") or 0
        kinds = inert(", ".join(f"{k} {_mib(v)}" for k, v in (storage.get("by_kind") or {}).items() if v))
        lines.append(Text(f"disk: {_mib(used)} of {_mib(quota)} used" + (f" ({kinds})" if kinds else ""),
                          style="bold red" if quota and used >= 0.9 * quota else ""))
    if idle >= stall_minutes * 60:
        lines.append(Text(f"STALLED: no agent call for {_ago(idle)} (threshold {stall_minutes:g} min)", style="bold red"))
    return Group(*lines)


def _spend(snapshot: dict[str, Any]) -> Table:
    run, meter = snapshot["run"], snapshot.get("agent_model")
    table = PlainTable("spend", "spent", "reserved", "remaining", "budget", title="Spend", title_justify="left")
    unspent = run.get("unspent_usd")  # an ended run's: nothing can spend it
    table.add_row("services (all)", _usd(run.get("spent_usd")), _usd(run.get("reserved_usd")),
                  _usd(run.get("remaining_usd")) if unspent is None else f"{_usd(unspent)} unspent",
                  _usd(run.get("budget_usd")))
    for svc, usd in sorted(snapshot.get("spend_by_service", {}).items()):
        table.add_row(f"  {svc}", _usd(usd), "", "", "")
    if meter is None:
        table.add_row("agent model", "no meter", "", "", "")
    else:
        table.add_row("agent model", _usd(meter.get("spent_usd")), _usd(meter.get("reserved_usd")),
                      _usd(meter.get("remaining_usd")), _usd(meter.get("budget_usd")))
    return table


def _turns(snapshot: dict[str, Any]) -> Table:
    table = PlainTable("time", "model", "cost", "last user message", "answer",
                  title=f"Agent turns (last {len(snapshot['turns'])} of {snapshot.get('turn_count', 0)})",
                  title_justify="left")
    for t in snapshot["turns"]:
        table.add_row((t.get("at") or "")[11:19], str(t.get("model")), _usd(t.get("cost_usd")), t["user"], t["answer"])
    return table


def _jobs(snapshot: dict[str, Any]) -> Table:
    table = PlainTable("job", "kind", "status", "model / benchmark", "progress", title="Running jobs", title_justify="left")
    for j in snapshot["jobs"]:
        what = j.get("model") or "-"
        if j.get("benchmark"):
            what += f" / {j['benchmark']}"
        progress = "-" if j.get("progress") is None else f"{j['done']}/{j['total']} ({j['progress']:.0%})"
        table.add_row(j["id"], j["kind"], j["status"], what, progress)
    return table


def _scores(snapshot: dict[str, Any]) -> Table:
    table = PlainTable("time", "job", "benchmark", "model", "status", "score", title="Last evaluations", title_justify="left")
    for e in snapshot["scores"]:
        score = "-" if e.get("score") is None else f"{e['score']:.3f}"
        table.add_row((e.get("at") or "")[:19], str(e.get("job_id")), str(e.get("benchmark")), str(e.get("model")),
                      str(e.get("status")), score)
    return table


def _audit(snapshot: dict[str, Any]) -> Text:
    audit = snapshot.get("audit")
    if audit is None:
        return Text("Audit: not audited yet")
    style = "green" if audit.get("status") == "accepted" else "yellow"
    rate = audit.get("hacking_rate")
    return Text.assemble("Audit: ", (inert(audit.get("status")), style),
                         f"  hacking rate {rate:.2f}" if isinstance(rate, (int, float)) else "",
                         inert(f"  ({(audit.get('created_at') or '')[:19]})"))


def _alerts(snapshot: dict[str, Any]) -> Text:
    """The live monitor's alerts (services/records/monitor.py): one line, the newest one's category."""
    alerts = snapshot.get("alerts") or []
    if not alerts:
        return Text("Monitor: no alerts")
    newest = alerts[0]
    return Text.assemble(("Monitor: ", "bold"), (f"{len(alerts)} alert(s)", "red"),
                         inert(f"  newest: {newest.get('code')} {newest.get('category')}"
                               f"{' (run paused)' if newest.get('paused') else ''} at "
                               f"{(newest.get('created_at') or '')[:19]}: {_clip(str(newest.get('evidence') or ''))}"))


def _integrity(snapshot: dict[str, Any]) -> Text:
    """The live integrity checks (services/records/live_integrity.py): one line."""
    integrity = snapshot.get("integrity")
    if not integrity:
        return Text("Integrity: unknown")
    found = integrity.get("contamination") or {}
    provenance = integrity.get("provenance") or []
    bad = [p for p in provenance if p.get("verdict") == "flag"]
    line = Text.assemble(("Integrity: ", "bold"),
                         (inert(integrity.get("live")), "red" if integrity.get("live") == "flagged" else "green"),
                         f"  contamination: {found.get('hits', 0)} of {found.get('scanned', 0)} dataset(s) hit")
    if found.get("tasks"):
        line.append(inert(f" ({len(found['tasks'])} task(s))"), style="red")
    line.append(f"  provenance: {len(provenance) - len(bad)} pass, ")
    line.append(f"{len(bad)} flagged", style="red" if bad else "")
    line.append(inert(f"  audit: {integrity.get('status')}"))
    return line


def render(snapshot: dict[str, Any], *, stall_minutes: float = 10.0) -> RenderableType:
    """One frame of the view; depends on nothing but its arguments."""
    parts: list[RenderableType] = [_header(snapshot, stall_minutes), _spend(snapshot), _turns(snapshot),
                                   _jobs(snapshot), _scores(snapshot), _audit(snapshot), _alerts(snapshot),
                                   _integrity(snapshot)]
    parts.extend(plain(f"unavailable: {e}", style="yellow") for e in snapshot.get("errors", []))
    return Group(*parts)


def watch(client: AdminClient, run_id: str, *, console: Console, interval: float = 2.0,
          stall_minutes: float = 10.0, once: bool = False) -> None:
    """Print one frame (``once``) or refresh the view every ``interval`` seconds until Ctrl-C."""
    if once:
        console.print(render(fetch_snapshot(client, run_id), stall_minutes=stall_minutes))
        return
    with Live(render(fetch_snapshot(client, run_id), stall_minutes=stall_minutes), console=console,
              refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render(fetch_snapshot(client, run_id), stall_minutes=stall_minutes))
        except KeyboardInterrupt:
            return
