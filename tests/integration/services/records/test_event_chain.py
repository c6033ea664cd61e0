"""The per-run hash chain of platform events (services/records/events.py), attacked directly in the
store — on SQLite and PostgreSQL: concurrent writers never fork it, and every way to change the
record without the platform's secret is caught by ``EventLog.verify``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select, update

from kit.settings import GymSettings
from ops.builder import ensure_internal_secret
from services.records.events import EVALUATION_JOB, GENESIS, TRAINING_JOB, EventLog, RecordEvent, RecordHead, event_hash
from storage.store import Store

SECRET = "platform-secret"


def fill(log: EventLog, run_id: str, n: int) -> None:
    for i in range(n):
        log.record(run_id=run_id, kind=TRAINING_JOB, data={"job_id": f"ftjob_{i}", "steps": i}, key_id="key_a")


def problems(log: EventLog, run_id: str) -> set[str]:
    return {p["problem"] for p in log.verify(run_id).problems}


def test_concurrent_appends_form_one_unbroken_chain_per_run(store: Store) -> None:
    log = EventLog(store, SECRET)
    errors: list[BaseException] = []

    def writer(run_id: str, n: int) -> None:
        try:
            fill(log, run_id, n)
        except BaseException as err:  # noqa: BLE001 - surfaced below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(f"run_{i % 2}", 15)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for run_id in ("run_0", "run_1"):
        report = log.verify(run_id)
        assert report.ok, report.problems
        assert report.events == report.head_seq == 45
        seqs = [e.seq for e in log.events(run_id)]
        assert seqs == list(range(1, 46))


def test_prepared_and_session_appends_write_the_same_chain(store: Store, sqlite_store: Store) -> None:
    """An append runs prepared statements on the caller's connection when the session is on the
    log's own store, and Core statements through the session otherwise: interleaved, the two make
    one sealed chain whose rows read back alike, including a value the hash covers in full."""
    fast = EventLog(store, SECRET)
    through_session = EventLog(sqlite_store, SECRET)  # another store: the session is not its own
    data = {"job_id": "ftjob_x", "loss": 0.125, "note": "ünïcode \u2028 \"quoted\"", "nested": {"a": [1, None, True]}}
    for i in range(6):
        log = fast if i % 2 == 0 else through_session
        with store.transaction() as s:
            appended = log.append(s, run_id="run_mix", kind=TRAINING_JOB, data={**data, "i": i}, key_id="key_a")
            assert appended.seq == i + 1
    report = fast.verify("run_mix")
    assert report.ok, report.problems
    assert report.events == report.head_seq == 6
    events = fast.events("run_mix")
    assert [e.data for e in events] == [{**data, "i": i} for i in range(6)]
    assert [e.prev_hash for e in events[1:]] == [e.hash for e in events[:-1]]
    with sqlite_store.transaction() as s:  # the other store's own database got nothing
        assert s.scalars(select(RecordEvent)).all() == []


def test_a_changed_event_is_caught_and_the_other_runs_are_untouched(store: Store) -> None:
    log = EventLog(store, SECRET)
    fill(log, "run_a", 5)
    fill(log, "run_b", 3)
    with store.transaction() as s:
        s.execute(update(RecordEvent).where(RecordEvent.run_id == "run_a", RecordEvent.seq == 3)
                  .values(data={"job_id": "ftjob_2", "steps": 999}))
    report = log.verify("run_a")
    assert not report.ok and report.problems[0]["seq"] == 3 and report.problems[0]["problem"] == "changed"
    assert log.verify("run_b").ok


@pytest.mark.parametrize("seq, expected", [(2, "deleted"), (5, "truncated")])
def test_a_deleted_or_truncated_event_is_caught(store: Store, seq: int, expected: str) -> None:
    log = EventLog(store, SECRET)
    fill(log, "run_a", 5)
    with store.transaction() as s:
        s.execute(delete(RecordEvent).where(RecordEvent.run_id == "run_a", RecordEvent.seq >= seq,
                                            RecordEvent.seq <= (seq if expected == "deleted" else 99)))
    assert expected in problems(log, "run_a")


def test_a_consistently_rewritten_chain_fails_the_head_seal(store: Store) -> None:
    """An attacker with the database but not the secret rewrites an event and recomputes every
    hash after it and the head's hash: only the head's HMAC gives it away."""
    log = EventLog(store, SECRET)
    fill(log, "run_a", 4)
    with store.transaction() as s:
        rows = list(s.scalars(select(RecordEvent).where(RecordEvent.run_id == "run_a").order_by(RecordEvent.seq)))
        prev = GENESIS
        for row in rows:
            data = {**row.data, "steps": 0} if row.seq == 2 else row.data
            digest = event_hash(run_id=row.run_id, seq=row.seq, kind=row.kind, key_id=row.key_id,
                                experiment_id=row.experiment_id, data=data, created_at=row.created_at, prev_hash=prev)
            s.execute(update(RecordEvent).where(RecordEvent.run_id == "run_a", RecordEvent.seq == row.seq)
                      .values(data=data, prev_hash=prev, hash=digest))
            prev = digest
        s.execute(update(RecordHead).where(RecordHead.run_id == "run_a").values(hash=prev))
    assert problems(log, "run_a") == {"head_forged"}
    # The platform's next event does not seal the forgery over: it carries the break with it.
    fill(log, "run_a", 1)
    report = log.verify("run_a")
    assert [(p["seq"], p["problem"]) for p in report.problems] == [(5, "head_forged")]
    # The platform's own verifier with another secret cannot vouch for the chain either.
    assert not EventLog(store, "another-secret").verify("run_a").ok


def test_deleting_the_whole_record_with_its_head_leaves_a_detectable_hole(store: Store) -> None:
    log = EventLog(store, SECRET)
    fill(log, "run_a", 3)
    with store.transaction() as s:
        s.execute(delete(RecordHead).where(RecordHead.run_id == "run_a"))
    assert problems(log, "run_a") == {"head_missing"}


def test_unknown_kinds_are_refused_and_nothing_is_written(store: Store) -> None:
    log = EventLog(store, SECRET)
    with pytest.raises(ValueError):
        log.record(run_id="run_a", kind="agent.claim", data={})
    log.record(run_id="run_a", kind=EVALUATION_JOB, data={"score": 0.5})
    assert [e.kind for e in log.events("run_a")] == [EVALUATION_JOB]


def test_the_embedded_gyms_secret_survives_a_restart_so_its_chains_stay_sealed(tmp_path: Path,
                                                                            make_gym: Callable[..., Any]) -> None:
    """A fresh secret at every `rsigym up` would make every run's head read as forged."""
    settings = GymSettings(data_dir=tmp_path / "gym")
    first = ensure_internal_secret(settings)
    path = tmp_path / "gym" / "internal-secret"
    assert path.stat().st_mode & 0o777 == 0o600
    assert ensure_internal_secret(settings) == first  # the next start reads it back
    assert ensure_internal_secret(GymSettings(data_dir=tmp_path / "gym", internal_secret="from-env")) == "from-env"

    gym = make_gym()
    data_dir = Path(gym.gateway.context.settings.data_dir)
    assert gym.gateway.internal_secret == (data_dir / "internal-secret").read_text().strip()
    log = EventLog(gym.gateway.store, gym.gateway.internal_secret)
    fill(log, "run_a", 2)
    restarted = EventLog(gym.gateway.store, ensure_internal_secret(GymSettings(data_dir=data_dir)))
    assert restarted.verify("run_a").ok
