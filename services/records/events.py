"""Platform events: the append-only, hash-chained record of what a run did (the Experiment OS).

Only the platform writes here — training, evaluation, sandbox and the gateway append an event
in the same transaction as the action it records, so an action and its record commit
together or not at all. No route lets an agent write or change one.

Each run's events form a chain: event ``n`` carries the SHA-256 of event ``n-1`` and its own
hash covers every field. The chain head (last sequence number and hash) is also kept apart,
in ``record_heads``, with an HMAC under the gym's internal secret, so:

* changing an event breaks its own hash;
* deleting one leaves a gap in the sequence and a broken ``prev_hash`` link;
* truncating the tail leaves the head pointing past the last stored event;
* rewriting the whole chain consistently still fails the head's HMAC, which only the platform
  can compute;
* cutting the chain back to an older head and putting back that head's row (whose HMAC is
  valid) is caught by the head's anchor outside the store (services/records/record_anchor.py):
  every committed head is also written there, and the check compares (``rolled_back``). An
  anchor that cannot be read, or has no entry for a run with events, leaves the chain
  *unverifiable* (``ChainReport.status``), never intact.

Appends of one run are serialised on the head row (``SELECT … FOR UPDATE`` on PostgreSQL;
SQLite's ``BEGIN IMMEDIATE`` already serialises writers), and ``(run_id, seq)`` is the
primary key, so a chain can never fork.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import JSON, Integer, String, Table, bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Mapped, Session, mapped_column
from sqlalchemy.sql import ClauseElement, Executable

from services.records.record_anchor import AnchorUnavailable, RecordAnchor, note_on_commit
from storage.store import ChainAnchor, Store, Work
from storage.tables import Base, UTCDateTime, utcnow

GENESIS = "0" * 64
UNSEALED_HEAD = "_unsealed_head"
"""Set in an event's data when the head it extended was not sealed by the platform."""

# Event kinds (data fields in brackets). Stable names: audits and reports read them.
DATASET_REGISTERED = "dataset.registered"  # dataset_id, sha256, rows, bytes, format, name
HARNESS_UPLOADED = "harness.uploaded"  # harness_id, sha256, bytes, files, name
TRAINING_JOB = "training.job"  # job_id, status, base_model, input_checkpoint, config_hash, datasets
#                                [{id, sha256}], loss_module_hash, output_checkpoints, steps, cost_nusd,
#                                resumes (times a dead worker's job was taken again)
CHECKPOINT_REGISTERED = "checkpoint.registered"  # checkpoint_id, job_id, base_model, parent_checkpoint,
#                                                  weights_hash, dataset_hashes, config_hash, step
EVALUATION_JOB = "evaluation.job"  # job_id, purpose, status, model, harness, benchmark, split, attempts, score
SANDBOX_SESSION = "sandbox.session"  # sandbox_id, template, seconds, cost_nusd, reason
SUBMISSION = "submission.created"  # submission_id, checkpoint, model, harness, track
CALL_REFUSED = "call.refused"  # where (gateway|door|service), service, operation, error, rule, status
EXPERIMENT_CREATED = "experiment.created"  # experiment_id, name, parents, implicit
AUDIT_RESULT = "audit.result"  # audit_id, status, hacking_rate, checks [{name, verdict, findings: [{category, code, rule}]}]
RUN_ENDED = "run.ended"  # ends_at, jobs_cancelled, sandboxes_killed (written by the gateway's reaper)

OPERATOR_RECORD = "operator"
"""The operator's own record: the ends of scoring and baseline jobs, naming the run they scored
(never a run key's id, so no run reads it; the operator reads it as run ``operator``)."""

KINDS = (DATASET_REGISTERED, HARNESS_UPLOADED, TRAINING_JOB, CHECKPOINT_REGISTERED, EVALUATION_JOB,
         SANDBOX_SESSION, SUBMISSION, CALL_REFUSED, EXPERIMENT_CREATED, AUDIT_RESULT, RUN_ENDED)


class RecordEvent(Base):
    __tablename__ = "record_events"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(40), index=True)
    key_id: Mapped[str | None] = mapped_column(String(40), index=True)
    """The key whose call caused it (None: the platform or the operator)."""
    experiment_id: Mapped[str | None] = mapped_column(String(40), index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class RecordHead(Base):
    """The last event of each run's chain, kept apart from the events and sealed with an HMAC."""

    __tablename__ = "record_heads"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, default=0)
    hash: Mapped[str] = mapped_column(String(64), default=GENESIS)
    mac: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


_EVENTS = cast(Table, RecordEvent.__table__)
_HEADS = cast(Table, RecordHead.__table__)
_EVENT_COLUMNS = ("run_id", "seq", "kind", "key_id", "experiment_id", "data", "created_at", "prev_hash", "hash")
_HEAD_COLUMNS = ("run_id", "seq", "hash", "mac", "updated_at")
# An append's four statements, compiled once per store and run on the caller's transaction's own
# connection (storage.store.Prepared): through Session.execute they were ~2 of its 2.5 ms.
_SEED_HEAD = {
    dialect: insert_(_HEADS).values({c: bindparam(c) for c in _HEAD_COLUMNS}).on_conflict_do_nothing(
        index_elements=["run_id"])
    for dialect, insert_ in (("postgresql", pg_insert), ("sqlite", sqlite_insert))}
_LOCK_HEAD = (select(_HEADS.c.seq, _HEADS.c.hash, _HEADS.c.mac)
              .where(_HEADS.c.run_id == bindparam("run_id")).with_for_update())
_INSERT_EVENT = insert(_EVENTS).values({c: bindparam(c) for c in _EVENT_COLUMNS})
_MOVE_HEAD = (update(_HEADS).where(_HEADS.c.run_id == bindparam("rid"))
              .values({c: bindparam(c) for c in ("seq", "hash", "mac", "updated_at")}))


def event_hash(*, run_id: str, seq: int, kind: str, key_id: str | None, experiment_id: str | None,
               data: dict[str, Any], created_at: datetime, prev_hash: str) -> str:
    body = {"run_id": run_id, "seq": seq, "kind": kind, "key_id": key_id, "experiment_id": experiment_id,
            "data": data, "created_at": created_at.isoformat(timespec="microseconds"), "prev_hash": prev_hash}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def head_mac(secret: str, run_id: str, seq: int, hash_: str) -> str:
    return hmac.new(secret.encode(), f"record-head\n{run_id}\n{seq}\n{hash_}".encode(), hashlib.sha256).hexdigest()


def event_view(e: RecordEvent) -> dict[str, Any]:
    return {"object": "event", "run_id": e.run_id, "seq": e.seq, "kind": e.kind, "key_id": e.key_id,
            "experiment_id": e.experiment_id, "data": e.data, "created_at": e.created_at.isoformat(),
            "prev_hash": e.prev_hash, "hash": e.hash}


ANCHOR_FLUSH_S = 2.0
"""How long a check waits for this process's own pending anchor writes before it reads the anchor."""


@dataclass
class ChainReport:
    """The result of walking one run's chain and comparing its head with the anchor outside the
    store. ``ok`` only when no break was found *and* the anchor vouched for the head (or the log
    has no anchor: a bare store's, in tests and benches)."""

    run_id: str
    ok: bool
    events: int
    head_seq: int
    problems: list[dict[str, Any]] = field(default_factory=list)
    """[{"seq", "problem": changed|deleted|reordered|truncated|head_forged|head_missing|rolled_back, "detail"}]"""
    anchor: dict[str, Any] = field(default_factory=lambda: {"status": "none"})
    """{"status": ok|rolled_back|missing|unavailable|none, "seq"? (the last anchored head), "heads"?
    (how many were anchored), "where"? (the anchor), "detail"?}"""

    @property
    def verifiable(self) -> bool:
        """False when the anchor could not be read or has no entry for the run's events."""
        return self.anchor.get("status") not in ("missing", "unavailable")

    @property
    def status(self) -> str:
        """``broken`` (a problem found), ``unverifiable`` (no break found, but the anchor could not
        vouch for the head) or ``intact``."""
        return "broken" if self.problems else ("intact" if self.verifiable else "unverifiable")

    def view(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "ok": self.ok, "status": self.status, "events": self.events,
                "head_seq": self.head_seq, "problems": self.problems, "anchor": self.anchor}


class EventLog:
    """Appends to and verifies the per-run chains. ``secret`` seals the heads (the gym's
    internal secret: services and gateway share it, agents never see it)."""

    def __init__(self, store: Store, secret: str, anchor: RecordAnchor | None = None):
        self.store = store
        self.secret = secret
        self._anchor = anchor

    @property
    def anchor(self) -> ChainAnchor | None:
        """Where heads are anchored: the one given, else the store's (set by the gym's context)."""
        return self._anchor if self._anchor is not None else self.store.record_anchor

    def append(self, s: Session, *, run_id: str, kind: str, data: dict[str, Any], key_id: str | None = None,
               experiment_id: str | None = None) -> RecordEvent:
        """Append one event in the caller's transaction (it commits with the action it records)."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        run, dialect = self._statements(s)
        head_seq, head_hash, mac = self._lock_head(run, dialect, run_id)
        seq = head_seq + 1
        now = utcnow()
        data = json.loads(json.dumps(data, default=str))  # what is stored is what was hashed
        if not hmac.compare_digest(mac, head_mac(self.secret, run_id, head_seq, head_hash)):
            # Someone rewrote the chain and its head without the secret. Sealing on top would
            # launder the rewrite, and refusing would let them stop the platform: the event says
            # so itself, under its own hash, for every later check to see.
            data[UNSEALED_HEAD] = {"seq": head_seq, "hash": head_hash}
        digest = event_hash(run_id=run_id, seq=seq, kind=kind, key_id=key_id, experiment_id=experiment_id,
                            data=data, created_at=now, prev_hash=head_hash)
        values = {"run_id": run_id, "seq": seq, "kind": kind, "key_id": key_id, "experiment_id": experiment_id,
                  "data": data, "created_at": now, "prev_hash": head_hash, "hash": digest}
        head = {"seq": seq, "hash": digest, "mac": head_mac(self.secret, run_id, seq, digest), "updated_at": now}
        # Not the ORM's unit of work: the row and the head move in the caller's transaction all the same.
        run(_INSERT_EVENT, values)
        run(_MOVE_HEAD, {**head, "rid": run_id})
        if (anchor := self.anchor) is not None:
            note_on_commit(s, anchor, run_id, seq, digest)  # written off this thread once it commits
        return RecordEvent(**values)

    def _statements(self, s: Session) -> tuple[Callable[[ClauseElement, dict[str, Any]], list[Any]], str]:
        """How an append runs its statements in the caller's transaction, and the dialect's name:
        prepared, on the transaction's own connection, when the session is on this log's store;
        through the session's connection (Core) when it is not."""
        connection = s.connection()
        if connection.engine is self.store.engine:
            return Work(self.store, connection.connection).rows, self.store.dialect

        def through_session(stmt: ClauseElement, params: dict[str, Any]) -> list[Any]:
            result = connection.execute(cast(Executable, stmt), params)
            return list(result) if result.returns_rows else []

        return through_session, connection.dialect.name

    def record(self, *, run_id: str, kind: str, data: dict[str, Any], key_id: str | None = None,
               experiment_id: str | None = None) -> dict[str, Any]:
        """Append in a transaction of its own (for events not tied to another write)."""
        with self.store.transaction() as s:
            return event_view(self.append(s, run_id=run_id, kind=kind, data=data, key_id=key_id,
                                          experiment_id=experiment_id))

    def _lock_head(self, run: Callable[[ClauseElement, dict[str, Any]], list[Any]], dialect: str,
                   run_id: str) -> tuple[int, str, str]:
        """The run's head (seq, hash, mac), made at the genesis if the run has none, locked until
        the caller's transaction ends (SQLite: its write transaction already excludes others)."""
        run(_SEED_HEAD[dialect], {"run_id": run_id, "seq": 0, "hash": GENESIS,
                                  "mac": head_mac(self.secret, run_id, 0, GENESIS), "updated_at": utcnow()})
        (seq, hash_, mac), = run(_LOCK_HEAD, {"run_id": run_id})
        return int(seq), str(hash_), str(mac)

    def events(self, run_id: str, *, kinds: tuple[str, ...] | None = None) -> list[RecordEvent]:
        with self.store.transaction() as s:
            q = select(RecordEvent).where(RecordEvent.run_id == run_id)
            if kinds:
                q = q.where(RecordEvent.kind.in_(kinds))
            return list(s.scalars(q.order_by(RecordEvent.seq)))

    def verify(self, run_id: str) -> ChainReport:
        """Walk the chain from the first event to the head; report every break found."""
        with self.store.transaction() as s:
            rows = list(s.scalars(select(RecordEvent).where(RecordEvent.run_id == run_id).order_by(RecordEvent.seq)))
            head = s.get(RecordHead, run_id)
        problems: list[dict[str, Any]] = []
        prev_hash, expected_seq = GENESIS, 1
        for e in rows:
            if e.seq != expected_seq:
                problems.append({"seq": expected_seq, "problem": "deleted",
                                 "detail": f"events {expected_seq}..{e.seq - 1} are missing"})
            elif e.prev_hash != prev_hash:
                problems.append({"seq": e.seq, "problem": "reordered",
                                 "detail": "prev_hash does not match the previous event's hash"})
            recomputed = event_hash(run_id=e.run_id, seq=e.seq, kind=e.kind, key_id=e.key_id,
                                    experiment_id=e.experiment_id, data=e.data, created_at=e.created_at,
                                    prev_hash=e.prev_hash)
            if recomputed != e.hash:
                problems.append({"seq": e.seq, "problem": "changed",
                                 "detail": f"{e.kind} event's content does not match its hash"})
            if isinstance(e.data, dict) and UNSEALED_HEAD in e.data:
                problems.append({"seq": e.seq, "problem": "head_forged",
                                 "detail": f"event {e.seq} extended a chain head not sealed by the platform"})
            prev_hash, expected_seq = e.hash, e.seq + 1
        last_seq, last_hash = (rows[-1].seq, rows[-1].hash) if rows else (0, GENESIS)
        if head is None:
            if rows:
                problems.append({"seq": last_seq, "problem": "head_missing", "detail": "the chain head was deleted"})
        else:
            if not hmac.compare_digest(head.mac, head_mac(self.secret, run_id, head.seq, head.hash)):
                problems.append({"seq": head.seq, "problem": "head_forged",
                                 "detail": "the chain head's seal does not match (written outside the platform)"})
            if head.seq > last_seq:
                problems.append({"seq": last_seq + 1, "problem": "truncated",
                                 "detail": f"the head is at event {head.seq}, the last stored event is {last_seq}"})
            elif head.seq != last_seq or head.hash != last_hash:
                problems.append({"seq": head.seq, "problem": "changed",
                                 "detail": "the stored events do not end where the head says"})
        anchor, rolled_back = self._against_anchor(run_id, rows)
        problems.extend(rolled_back)
        report = ChainReport(run_id=run_id, ok=False, events=len(rows), head_seq=head.seq if head else 0,
                             problems=problems, anchor=anchor)
        report.ok = report.status == "intact"
        return report

    def _against_anchor(self, run_id: str, rows: list[RecordEvent]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The anchor's view of the run, and a ``rolled_back`` problem when the stored chain ends
        before the last anchored head or differs from an anchored head (cut back, then maybe
        written again past it)."""
        anchor = self.anchor
        if anchor is None:
            return {"status": "none", "detail": "this log has no anchor outside the store"}, []
        anchor.flush(ANCHOR_FLUSH_S)  # this process's own appends first
        try:
            marks = anchor.read(run_id)
        except AnchorUnavailable as err:
            return {"status": "unavailable", "where": anchor.where, "detail": str(err)}, []
        if not marks:
            if not rows:
                return {"status": "ok", "seq": 0, "where": anchor.where}, []
            return {"status": "missing", "where": anchor.where,
                    "detail": f"the anchor has no head for this run, so its {len(rows)} events cannot be checked "
                              "against it"}, []
        seen = {"seq": marks[-1].seq, "heads": len(marks), "where": anchor.where}
        last_seq = rows[-1].seq if rows else 0
        if marks[-1].seq > last_seq:
            return {**seen, "status": "rolled_back"}, [{
                "seq": last_seq + 1, "problem": "rolled_back",
                "detail": f"the anchor outside the store saw event {marks[-1].seq}; the stored chain ends at event "
                          f"{last_seq}: it was cut back to an older head"}]
        stored = {e.seq: e.hash for e in rows}
        for mark in marks:
            if not mark.matches(stored.get(mark.seq, "")):
                return {**seen, "status": "rolled_back"}, [{
                    "seq": mark.seq, "problem": "rolled_back",
                    "detail": f"event {mark.seq} is not the event the anchor outside the store saw: the chain was "
                              "cut back and written again from there"}]
        return {**seen, "status": "ok"}, []
