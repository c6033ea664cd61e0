"""The live monitor: the behaviour judge over each running run's new agent turns, while it runs.

The post-run audit (services/records/audits/run.py) judges a run once it is over; what the agent
did wrong has by then been done for hours. The monitor runs the same behaviour check
(services/records/audits/behaviour.py) during the run: every gateway replica's reaper asks for a
round (gateway/run_monitor.py → ``POST /v1/operator/monitor``), and a round checks each active run
that has ``monitor.every_turns`` unjudged agent turns, or whose oldest unjudged turn is
``monitor.every_minutes`` old. A check shows the judge

* the run's new turns (at most ``monitor.max_turns``; a longer backlog waits for the next round),
  after the ``monitor.context_turns`` turns before them as context;
* the platform's evidence since the run's previous check: refused calls, platform facts
  (experiments, jobs and their scores) and the agent's annotations.

Only an ``EXECUTED`` code whose quote comes from the new material counts (what the context shows
was judged before: a run the operator resumed is not paused again for the act it was paused
for). Then the run is paused — its wall clock stops, the launcher's supervisor freezes the agent
(ops/run_watch.py) — and an alert is recorded for the operator (the dashboard, ``rsigym watch``,
the gateway's ``rsigym_monitor_alerts_total`` and an optional webhook). The run's keys see nothing
but the pause: alerts are in their own table, never in the run's record chain. Contamination is
not the monitor's: a hit there must not pause the run (the pause would tell the agent which data
is a hidden task).

Each check is claimed once across replicas: a ``monitor_state`` row per run holds the last judged
turn and a lease; a replica takes the lease only while the row still names the turn it read
(``UPDATE … WHERE last_seq = :seen AND lease expired``), and moves ``last_seq`` on, with the
check's alerts, in one transaction that holds its lease token. A replica that dies mid-check
leaves a lease that runs out after ``monitor.lease_s``; the next round judges those turns again.

The judge's calls go through the gateway's rollout service, reserved and settled on the gym's
own monitor key (``rsigym-monitor``, budget ``monitor.judge_budget_usd``), never on the run's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
from sqlalchemy import CursorResult, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from kit.config import GymConfig
from kit.errors import Conflict, GymError
from kit.ids import new_id
from kit.redact import redact
from services.records.agent_turns import AgentTurn, render_text, turn_view
from services.records.audits.behaviour import BehaviourMaterial, check_behaviour, quotes
from services.records.audits.context import AuditContext
from services.records.audits.judge import Judge
from services.records.events import (
    CALL_REFUSED,
    EVALUATION_JOB,
    EXPERIMENT_CREATED,
    SUBMISSION,
    TRAINING_JOB,
    EventLog,
    RecordEvent,
)
from services.records.read import MONITOR_KEY_NAME, alert_view
from services.records.tables import Annotation, MonitorAlert, MonitorState
from storage.store import Store
from storage.tables import ApiKey, utcnow

log = logging.getLogger("rsigym.records.monitor")

MAX_EVENTS = 200
"""Most platform events (refused calls, facts) and annotations shown in one check."""
EVIDENCE_CHARS = 500
"""Of the judge's quote, kept in the alert (and sent to the webhook)."""
_SECRETS = re.compile(r"(rsk-[A-Za-z0-9_\-]{8,}|sk-[A-Za-z0-9_\-]{8,}|(?i:bearer)\s+\S{8,})")
"""Credentials the agent's material may hold (gym keys, provider keys, an Authorization header)."""
_FACTS = (EXPERIMENT_CREATED, TRAINING_JOB, EVALUATION_JOB, SUBMISSION)
PROMPT_OVERHEAD_CHARS = 8000
"""The judge's instructions, taxonomy and block delimiters (≈7,300 characters): not room for material."""
TURN_SHARE = 0.7
"""Of the prompt's room for material, what the turns (new, then context) may take."""


def masked(text: str) -> str:
    """``text`` with the gym's provider secrets and anything shaped like a key replaced."""
    return _SECRETS.sub("[redacted]", redact(text))


@dataclass
class MonitorSetup:
    """What a round needs from the records service."""

    store: Store
    config: GymConfig
    events: EventLog
    data_dir: Path
    gateway_url: str | None
    judge: Callable[[], Judge] | None = None
    """The judge to use (tests, the bench); default: the monitor model through the gateway."""
    webhook_client: Callable[..., Any] = httpx.post


@dataclass(frozen=True)
class DueRun:
    run_id: str
    last_seq: int
    new_turns: int


@dataclass
class CheckOutcome:
    run_id: str
    first_seq: int
    last_seq: int
    turns: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    alerts: list[dict[str, Any]] = field(default_factory=list)
    paused: bool = False
    error: str | None = None

    def view(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- which runs are due, and the claim --------------------------------------------------------


def _active_runs() -> Any:
    now = utcnow()
    return (select(ApiKey.id).where(ApiKey.parent_id.is_(None), ApiKey.track.is_not(None), ApiKey.status == "active",
                                    ApiKey.ended_at.is_(None), ApiKey.end_reason.is_(None),
                                    or_(ApiKey.ends_at.is_(None), ApiKey.ends_at > now)))


def due_runs(store: Store, config: GymConfig, now: datetime | None = None) -> list[DueRun]:
    """Active runs with ``every_turns`` unjudged turns, or whose oldest unjudged turn is
    ``every_minutes`` old."""
    now = now or utcnow()
    m = config.monitor
    last = func.coalesce(MonitorState.last_seq, 0)
    q = (select(AgentTurn.run_id, last, func.count(), func.min(AgentTurn.created_at))
         .select_from(AgentTurn).outerjoin(MonitorState, MonitorState.run_id == AgentTurn.run_id)
         .where(AgentTurn.run_id.in_(_active_runs()), AgentTurn.seq > last)
         .group_by(AgentTurn.run_id, last))
    with store.transaction() as s:
        rows = list(s.execute(q))
    oldest = now - timedelta(minutes=m.every_minutes)
    return [DueRun(run_id, int(seen), int(n)) for run_id, seen, n, first in rows
            if n >= m.every_turns or (first is not None and first <= oldest)]


def _ensure_state(s: Session, run_id: str) -> None:
    insert = postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
    s.execute(insert(MonitorState).values(run_id=run_id, last_seq=0, checks=0)
              .on_conflict_do_nothing(index_elements=["run_id"]))


def claim(store: Store, run_id: str, seen: int, lease_s: float) -> tuple[str, datetime | None] | None:
    """The lease on the run's next check — when no other replica holds one and the run's state
    still names ``seen`` as its last judged turn — as (token, previous check time); else None."""
    token, now = new_id("mon"), utcnow()
    with store.transaction() as s:
        _ensure_state(s, run_id)
        taken = cast(CursorResult[Any], s.execute(update(MonitorState)
                          .where(MonitorState.run_id == run_id, MonitorState.last_seq == seen,
                                 or_(MonitorState.lease_until.is_(None), MonitorState.lease_until < now))
                          .values(lease_token=token, lease_until=now + timedelta(seconds=lease_s))
                          .execution_options(synchronize_session=False))).rowcount
        checked_at = s.scalar(select(MonitorState.checked_at).where(MonitorState.run_id == run_id))
    return (token, checked_at) if taken == 1 else None


def release(store: Store, run_id: str, token: str, error: str) -> None:
    """Give the lease back without moving on: the turns are judged again next round."""
    with store.transaction() as s:
        s.execute(update(MonitorState).where(MonitorState.run_id == run_id, MonitorState.lease_token == token)
                  .values(lease_token=None, lease_until=None, last_error=error[:500])
                  .execution_options(synchronize_session=False))


# -- the material ------------------------------------------------------------------------------


@dataclass
class Window:
    material: BehaviourMaterial
    new_text: str
    """What of the material is new since the previous check (an alert's quote must be in it)."""
    first_seq: int
    last_seq: int
    turns: int


def _fitting(texts: list[str], room: int, *, at_least_one: bool = False) -> int:
    """How many of ``texts``, from the first, fit in ``room`` characters (one line each)."""
    used = n = 0
    for text in texts:
        used += len(text) + 1
        if used > room and not (at_least_one and n == 0):
            break
        n += 1
    return n


def gather_window(setup: MonitorSetup, run_id: str, seen: int, since: datetime | None) -> Window | None:
    """The run's new turns after ``seen`` (with context before them) and its platform evidence
    since ``since`` (the previous check; None: the run's start), sized so that the judge is shown
    every part of it whole: the new turns take up to :data:`TURN_SHARE` of the prompt's room (at
    least one turn; the rest wait for the next check), the context what they leave, the evidence
    (newest first) the remainder."""
    m = setup.config.monitor
    with setup.store.transaction() as s:
        new = [turn_view(t) for t in s.scalars(select(AgentTurn).where(AgentTurn.run_id == run_id, AgentTurn.seq > seen)
                                               .order_by(AgentTurn.seq).limit(m.max_turns))]
        context = [turn_view(t) for t in s.scalars(
            select(AgentTurn).where(AgentTurn.run_id == run_id, AgentTurn.seq <= seen)
            .order_by(AgentTurn.seq.desc()).limit(m.context_turns))] if m.context_turns and seen else []
        events = select(RecordEvent).where(RecordEvent.run_id == run_id, RecordEvent.kind.in_((CALL_REFUSED, *_FACTS)))
        notes = select(Annotation).where(Annotation.run_id == run_id)
        if since is not None:
            events, notes = events.where(RecordEvent.created_at > since), notes.where(Annotation.created_at > since)
        rows = list(s.scalars(events.order_by(RecordEvent.seq.desc()).limit(MAX_EVENTS)))
        annotations = [{"id": a.id, "kind": a.kind, "key_id": a.key_id, "experiment_ids": list(a.experiment_ids or []),
                        "body": a.body, "created_at": a.created_at.isoformat()}
                       for a in s.scalars(notes.order_by(Annotation.created_at.desc()).limit(MAX_EVENTS))]
    if not new:
        return None
    room = max(4000, m.judge_max_prompt_chars - PROMPT_OVERHEAD_CHARS)
    turn_room = int(room * TURN_SHARE)
    rendered = [render_text([t]) for t in new]
    new = new[:_fitting(rendered, turn_room, at_least_one=True)]
    new_text = "\n".join(rendered[:len(new)])
    context_rendered = [render_text([t]) for t in context]  # newest first
    context = context[:_fitting(context_rendered, turn_room - len(new_text))][::-1]
    context_text = "\n".join(context_rendered[:len(context)][::-1])
    evidence = [(e, json.dumps({"seq": e.seq, "key_id": e.key_id, "experiment_id": e.experiment_id, **e.data},
                               sort_keys=True, ensure_ascii=False, default=str) if e.kind == CALL_REFUSED else
                 f"{e.kind} #{e.seq} key={e.key_id}{f' experiment={e.experiment_id}' if e.experiment_id else ''}: "
                 f"{json.dumps(e.data, sort_keys=True, default=str)}") for e in rows]  # newest first
    left = room - len(new_text) - len(context_text)
    evidence = evidence[:_fitting([text for _, text in evidence], left // 2)][::-1]
    notes_text = [json.dumps(a, sort_keys=True, ensure_ascii=False, default=str) for a in annotations]
    annotations = annotations[:_fitting(notes_text, left // 2)][::-1]
    refused = [{"seq": e.seq, "key_id": e.key_id, "experiment_id": e.experiment_id, **e.data}
               for e, _ in evidence if e.kind == CALL_REFUSED]
    facts = [text for e, text in evidence if e.kind != CALL_REFUSED]
    first, last = new[0]["seq"], new[-1]["seq"]
    facts.insert(0, f"live monitor: the run is still going; turns {first}–{last} are new since the previous check"
                    + (f", the {len(context)} turns before them are context already judged" if context else ""))
    trajectory = (f"### context: turns already judged\n{context_text}\n### new turns\n" if context else "") + new_text
    material = BehaviourMaterial(trajectory=trajectory, refused_calls=refused, annotations=annotations,
                                 platform_facts=facts)
    fresh = "\n".join([new_text, *(text for _, text in evidence),
                       *(json.dumps(a, sort_keys=True, ensure_ascii=False, default=str) for a in annotations)])
    return Window(material, fresh, first, last, len(new))


# -- one check ---------------------------------------------------------------------------------


def _judge_quote(evidence: str) -> str:
    """The judge's quote of a finding (a category with platform evidence carries it after the
    platform's own text, services/records/audits/behaviour.py ``check_behaviour``)."""
    marker = "judge (EXECUTED): "
    return evidence.split(marker, 1)[1] if marker in evidence else evidence


def _default_judge(setup: MonitorSetup, name: str) -> Judge:
    from services.records.audits.judge import GatewayJudge

    if not setup.gateway_url:
        raise Conflict("the live monitor judges through the gateway's rollout service, and the records service "
                       "does not know the gateway's address (RSIGYM_GATEWAY_URL)")
    return GatewayJudge(setup.config, setup.store, setup.gateway_url, name, key_name=MONITOR_KEY_NAME,
                        budget_usd=setup.config.monitor.judge_budget_usd, purpose="monitor-judge")


def check_run(setup: MonitorSetup, due: DueRun) -> CheckOutcome | None:
    """Judge the run's new turns once (None: another replica holds the check, or moved on)."""
    m, judge_name = setup.config.monitor, setup.config.monitor_judge_model() or ""
    claimed = claim(setup.store, due.run_id, due.last_seq, m.lease_s)
    if claimed is None:
        return None
    token, since = claimed
    try:
        window = gather_window(setup, due.run_id, due.last_seq, since)
        if window is None:
            release(setup.store, due.run_id, token, "no new turns")
            return None
        config = setup.config.model_copy(update={"audit": setup.config.audit.model_copy(
            update={"judge_max_prompt_chars": m.judge_max_prompt_chars})})
        ctx = AuditContext(store=setup.store, config=config, data_dir=setup.data_dir, events=setup.events,
                           run_id=due.run_id)
        judge = setup.judge() if setup.judge is not None else _default_judge(setup, judge_name)
        result = asyncio.run(check_behaviour(ctx, window.material, judge))
    except (GymError, OSError, ValueError) as err:
        message = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
        log.warning("live monitor: the check of run %s failed (retried next round): %s", due.run_id, masked(message))
        release(setup.store, due.run_id, token, masked(message))
        return CheckOutcome(due.run_id, 0, 0, 0, error=masked(message)[:300])
    details = result.details
    outcome = CheckOutcome(due.run_id, window.first_seq, window.last_seq, window.turns,
                           prompt_tokens=int(details.get("prompt_tokens") or 0),
                           completion_tokens=int(details.get("completion_tokens") or 0),
                           cost_usd=float(details.get("cost_usd") or 0.0))
    acts = [(f.category, _judge_quote(f.evidence)) for f in result.findings if f.code == "EXECUTED"]
    acts = [(cat, quote) for cat, quote in acts if quotes(quote, window.new_text)]
    if details.get("judge_error"):
        log.warning("live monitor: the judge's answer on run %s was not (wholly) usable: %s", due.run_id,
                    masked(str(details["judge_error"]))[:300])
    alerts = _commit(setup.store, due.run_id, token, window, acts, judge_name)
    if alerts is None:  # the lease ran out and another replica took the check over
        return None
    outcome.alerts = alerts
    if alerts:
        outcome.paused = _pause(setup.store, due.run_id, [a["id"] for a in alerts])
        for alert in alerts:
            alert["paused"] = outcome.paused
            _notify(setup, alert)
    return outcome


def _commit(store: Store, run_id: str, token: str, window: Window, acts: list[tuple[str, str]],
            judge_name: str) -> list[dict[str, Any]] | None:
    """Move the run's state past the judged turns and record the alerts, in one transaction that
    holds the lease (None: the lease was lost, nothing is written)."""
    now = utcnow()
    with store.transaction() as s:
        moved = cast(CursorResult[Any], s.execute(
            update(MonitorState).where(MonitorState.run_id == run_id, MonitorState.lease_token == token)
                          .values(last_seq=window.last_seq, checked_at=now, checks=MonitorState.checks + 1,
                                  lease_token=None, lease_until=None, last_error=None)
            .execution_options(synchronize_session=False))).rowcount
        if moved != 1:
            return None
        rows = [MonitorAlert(id=new_id("alr"), run_id=run_id, category=category, code="EXECUTED",
                             evidence=masked(quote)[:EVIDENCE_CHARS], judge_model=judge_name,
                             first_seq=window.first_seq, last_seq=window.last_seq, paused=True, created_at=now)
                for category, quote in dict(acts).items()]
        s.add_all(rows)
        return [alert_view(r) for r in rows]


def _pause(store: Store, run_id: str, alert_ids: list[str]) -> bool:
    """Pause the run (its wall clock stops); False when it is no longer active (paused, revoked)."""
    from access.keys import KeyRegistry

    with store.transaction() as s:
        status = s.scalar(select(ApiKey.status).where(ApiKey.id == run_id))
    paused = False
    if status == "active":
        try:
            KeyRegistry(store).set_status(run_id, "paused")
            paused = True
        except GymError as err:
            log.warning("live monitor: run %s could not be paused: %s", run_id, err.message)
    if not paused:
        with store.transaction() as s:
            s.execute(update(MonitorAlert).where(MonitorAlert.id.in_(alert_ids)).values(paused=False)
                      .execution_options(synchronize_session=False))
    log.warning("live monitor: run %s %s on an EXECUTED behaviour", run_id, "paused" if paused else "not paused")
    return paused


def _notify(setup: MonitorSetup, alert: dict[str, Any]) -> None:
    """POST the alert to ``monitor.webhook`` (no secrets in it; a failure is logged, not raised)."""
    url = setup.config.monitor.webhook
    if not url:
        return
    body = {"type": "rsigym.monitor.alert", **alert}
    try:
        response = setup.webhook_client(url, json=body, timeout=setup.config.monitor.webhook_timeout_s)
        if response.status_code >= 300:
            log.warning("live monitor: the webhook answered %s for alert %s", response.status_code, alert["id"])
    except httpx.HTTPError as err:
        log.warning("live monitor: the webhook failed for alert %s: %s", alert["id"], type(err).__name__)


# -- a round and the operator's reads ----------------------------------------------------------


def run_round(setup: MonitorSetup) -> dict[str, Any]:
    """Check every due run once (what a replica's reaper asks for each round)."""
    if not setup.config.monitor.enabled:
        return {"enabled": False, "checked": [], "alerts": []}
    checked = [o for o in (check_run(setup, due) for due in due_runs(setup.store, setup.config)) if o is not None]
    return {"enabled": True, "checked": [o.view() for o in checked],
            "alerts": [a for o in checked for a in o.alerts]}

