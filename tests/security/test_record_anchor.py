"""A record chain cut back to an older head is caught by the head's anchor outside the store
(services/records/record_anchor.py): on SQLite with the embedded file anchor, on PostgreSQL with the
Redis anchor.

The attacker has write access to the store but neither the internal secret nor the anchor: it
snapshots a run's head row (a valid seal), lets the platform append more, then deletes the later
events and puts the old head row back — which the store alone cannot tell from an intact, shorter
chain. An anchor that cannot vouch for a head leaves the chain unverifiable, never intact.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import delete, update
from typer.testing import CliRunner

from kit.settings import StoreSettings
from ops.cli.main import app as operator_cli
from services.records.events import TRAINING_JOB, EventLog, RecordEvent, RecordHead
from services.records.record_anchor import FILE_NAME, FileAnchor, Mark, RecordAnchor, RedisAnchor
from storage.store import Store, sqlite_url
from tests.conftest import ADMIN_TOKEN, PG_URL, admin_headers, bearer, create_key, gym_config, require_redis
from tests.fakes.servers import serve_gym

SECRET = "platform-secret"
REDIS_URL = os.environ.get("RSIGYM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = "rsigym-test:record-anchor:"


def _redis() -> str:
    return require_redis(REDIS_URL)


def redis_anchor(namespace: str, url: str = REDIS_URL) -> RecordAnchor:
    return RecordAnchor(RedisAnchor(url, SECRET, namespace=namespace, prefix=PREFIX, timeout_s=2))


@pytest.fixture(params=["sqlite+file", "postgres+redis"])
def anchored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, RecordAnchor]]:
    """A migrated store and its anchor: SQLite with the file, PostgreSQL with Redis."""
    if request.param == "sqlite+file":
        store = Store(sqlite_url(tmp_path), StoreSettings())
        anchor = RecordAnchor(FileAnchor(tmp_path / FILE_NAME, SECRET))
        namespace = None
    else:
        _redis()
        store = Store(PG_URL, StoreSettings(), schema=request.getfixturevalue("pg_schema"))
        namespace = "t" + secrets.token_hex(6)
        anchor = redis_anchor(namespace)
    store.migrate()
    yield store, anchor
    anchor.close()
    store.dispose()
    if namespace is not None:
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{PREFIX}{namespace}:*"):
            client.delete(key)


def fill(log: EventLog, run_id: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.record(run_id=run_id, kind=TRAINING_JOB, data={"job_id": f"ftjob_{i}", "steps": i}, key_id="key_a")


def snapshot_head(store: Store, run_id: str) -> dict[str, Any]:
    with store.transaction() as s:
        head = s.get(RecordHead, run_id)
        assert head is not None
        return {"seq": head.seq, "hash": head.hash, "mac": head.mac, "updated_at": head.updated_at}


def roll_back(store: Store, run_id: str, head: dict[str, Any]) -> None:
    """The attack: the events after the snapshot deleted, the snapshot's head row put back."""
    with store.transaction() as s:
        s.execute(delete(RecordEvent).where(RecordEvent.run_id == run_id, RecordEvent.seq > head["seq"]))
        s.execute(update(RecordHead).where(RecordHead.run_id == run_id).values(**head))


@contextlib.contextmanager
def bare(store: Store) -> Iterator[Store]:
    """Another Store object on the same database, with no anchor: the store alone."""
    alone = Store(store.url, StoreSettings(), schema=store.schema)
    try:
        yield alone
    finally:
        alone.dispose()


def problems(log: EventLog, run_id: str) -> list[tuple[int, str]]:
    return [(p["seq"], p["problem"]) for p in log.verify(run_id).problems]


def test_a_chain_cut_back_to_an_older_sealed_head_is_caught(anchored: tuple[Store, RecordAnchor]) -> None:
    store, anchor = anchored
    log = EventLog(store, SECRET, anchor=anchor)
    fill(log, "run_a", 3)
    old = snapshot_head(store, "run_a")
    fill(log, "run_a", 4, start=3)
    fill(log, "run_b", 2)
    assert log.verify("run_a").view()["status"] == "intact" and log.verify("run_a").anchor["seq"] == 7
    roll_back(store, "run_a", old)
    # the store alone vouches for the shorter chain: the old head's seal is valid
    bare = EventLog(store, SECRET)
    assert bare.anchor is None and bare.verify("run_a").ok and bare.verify("run_a").events == 3
    report = log.verify("run_a")
    assert not report.ok and report.status == "broken" and report.anchor["status"] == "rolled_back"
    assert problems(log, "run_a") == [(4, "rolled_back")]
    assert "saw event 7" in report.problems[0]["detail"] and "ends at event 3" in report.problems[0]["detail"]
    assert log.verify("run_b").ok  # the other run is untouched
    # the platform goes on appending on the cut chain, past the old head: still caught
    fill(log, "run_a", 6, start=100)
    assert log.verify("run_a").events == 9
    ((seq, problem),) = problems(log, "run_a")  # at the first anchored head of 4..7 (the writer batches)
    assert problem == "rolled_back" and 4 <= seq <= 7
    assert "written again" in log.verify("run_a").problems[0]["detail"]


def test_a_run_whose_events_and_head_are_all_deleted_is_caught(anchored: tuple[Store, RecordAnchor]) -> None:
    store, anchor = anchored
    log = EventLog(store, SECRET, anchor=anchor)
    fill(log, "run_a", 3)
    with store.transaction() as s:
        s.execute(delete(RecordEvent).where(RecordEvent.run_id == "run_a"))
        s.execute(delete(RecordHead).where(RecordHead.run_id == "run_a"))
    assert EventLog(store, SECRET).verify("run_a").ok  # an empty, intact chain to the store alone
    assert problems(log, "run_a") == [(1, "rolled_back")]


def test_an_append_rolled_back_with_its_action_anchors_nothing(anchored: tuple[Store, RecordAnchor]) -> None:
    store, anchor = anchored
    log = EventLog(store, SECRET, anchor=anchor)
    fill(log, "run_a", 2)
    with pytest.raises(RuntimeError), store.transaction() as s:
        log.append(s, run_id="run_a", kind=TRAINING_JOB, data={"job_id": "ftjob_x"})
        raise RuntimeError("the action failed")
    fill(log, "run_a", 1, start=5)
    report = log.verify("run_a")
    assert report.ok and report.events == 3 and report.anchor["seq"] == 3


def test_an_anchor_that_cannot_vouch_leaves_the_chain_unverifiable(anchored: tuple[Store, RecordAnchor],
                                                                      tmp_path: Path) -> None:
    store, anchor = anchored
    fill(EventLog(store, SECRET), "run_old", 2)  # written where no anchor saw it (a gym before anchors)
    log = EventLog(store, SECRET, anchor=anchor)
    report = log.verify("run_old")
    assert (report.ok, report.status, report.anchor["status"]) == (False, "unverifiable", "missing")
    fill(log, "run_old", 1, start=2)  # the next append anchors it from here on
    assert log.verify("run_old").ok
    assert log.verify("run_never").ok  # no events, nothing to anchor
    unreachable = (RecordAnchor(FileAnchor(tmp_path / "gone" / FILE_NAME, SECRET))
                   if isinstance(anchor.backend, FileAnchor) else redis_anchor("x", "redis://127.0.0.1:1/0"))
    if isinstance(anchor.backend, FileAnchor):
        (tmp_path / "gone").mkdir()
        (tmp_path / "gone" / FILE_NAME).write_text("x" * 9 + "\n")
        assert isinstance(unreachable.backend, FileAnchor)
        unreachable.backend.read("run_old")  # read once, then the file is swapped for a shorter one
        (tmp_path / "gone" / FILE_NAME).write_text("")
    report = EventLog(store, SECRET, anchor=unreachable).verify("run_old")
    assert (report.ok, report.status, report.anchor["status"]) == (False, "unverifiable", "unavailable")
    assert report.problems == [] and report.anchor["detail"]
    unreachable.close()


def test_the_anchor_file_is_private_append_only_and_sealed_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "data" / FILE_NAME
    one, two = FileAnchor(path, SECRET), FileAnchor(path, SECRET)  # two processes' views of one file
    assert one.advance({"run_a": Mark(1, "a" * 64), "run_b": Mark(1, "b" * 64)}) == []
    assert two.advance({"run_a": Mark(2, "c" * 64)}) == []  # continues the chain of seals after one's lines
    assert one.advance({"run_a": Mark(2, "d" * 64), "run_b": Mark(3, "e" * 64)}) == ["run_a"]  # forked: kept out
    assert [m.seq for m in FileAnchor(path, SECRET).read("run_a")] == [1, 2]
    assert FileAnchor(path, SECRET).read("run_a")[-1].matches("c" * 64)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line)[0] == "v1" for line in lines)
    with open(path, "a") as fh:  # a crashed writer's torn line: skipped, and the next write goes on
        fh.write('["v1","run_a",3,"ff')
    assert FileAnchor(path, SECRET).advance({"run_c": Mark(1, "f" * 64)}) == []
    assert [m.seq for m in FileAnchor(path, SECRET).read("run_b")] == [1, 3]
    # a dropped line, an edited one or another secret: every later seal fails
    text = path.read_text().splitlines(keepends=True)
    for edited in (text[:1] + text[2:],
                   [text[0].replace('"run_a",1', '"run_a",9'), *text[1:]]):
        path.write_text("".join(edited))
        with pytest.raises(Exception, match="not sealed by the platform"):
            FileAnchor(path, SECRET).read("run_b")
    path.write_text("".join(text))
    with pytest.raises(Exception, match="not sealed"):
        FileAnchor(path, "another-secret").read("run_a")


def test_the_redis_anchor_only_moves_forward_and_is_sealed() -> None:
    _redis()
    namespace = "t" + secrets.token_hex(6)
    backend = RedisAnchor(REDIS_URL, SECRET, namespace=namespace, prefix=PREFIX, timeout_s=2)
    try:
        assert backend.advance({"run_a": Mark(5, "a" * 64)}) == []
        assert backend.advance({"run_a": Mark(5, "a" * 64)}) == []  # again: nothing changes
        assert backend.advance({"run_a": Mark(3, "b" * 64)}) == ["run_a"]  # backwards: refused
        assert backend.advance({"run_a": Mark(5, "c" * 64)}) == ["run_a"]  # forked at the head: refused
        assert [(m.seq, m.hash) for m in backend.read("run_a")] == [(5, "a" * 64)]
        client = redis.Redis.from_url(REDIS_URL)
        client.hset(backend.key("run_a"), "4", "d" * 64 + ":" + "0" * 64)  # written without the secret
        with pytest.raises(Exception, match="not sealed by the platform"):
            backend.read("run_a")
    finally:
        redis.Redis.from_url(REDIS_URL).delete(backend.key("run_a"))
        backend.close()


# -- the gym: its own anchor, the admin API, the audit and the CLI ------------------------------------


@pytest.fixture(params=["sqlite", "postgres+redis"])
def gym_and_store(request: pytest.FixtureRequest, make_gym: Callable[..., Any],
                  monkeypatch: pytest.MonkeyPatch, standin: tuple[str, Any]) -> Iterator[tuple[Any, str]]:
    """An embedded gym as ``rsigym up`` builds it: SQLite and the data dir's file anchor, or
    PostgreSQL with the anchor in Redis (RSIGYM_RECORD_ANCHOR_*, as a distributed gym sets
    RSIGYM_REDIS_URL)."""
    namespace = None
    if request.param == "sqlite":
        gym = make_gym(config=_judged(standin[0]))
    else:
        _redis()
        namespace = "t" + secrets.token_hex(6)
        monkeypatch.setenv("RSIGYM_RECORD_ANCHOR_KIND", "redis")
        monkeypatch.setenv("RSIGYM_RECORD_ANCHOR_REDIS_URL", REDIS_URL)
        monkeypatch.setenv("RSIGYM_RECORD_ANCHOR_NAMESPACE", namespace)
        monkeypatch.setenv("RSIGYM_RECORD_ANCHOR_KEY_PREFIX", PREFIX)
        store = request.getfixturevalue("pg_store")
        gym = make_gym(store=store, config=_judged(standin[0]))
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield gym, url
    if namespace is not None:
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{PREFIX}{namespace}:*"):
            client.delete(key)


def _judged(api_base: str) -> Any:
    config = gym_config(api_base)
    config.audit.judge_model = "judge"  # the stand-in provider answers the judge's prompt
    return config


def rsigym(*args: str, code: int | None = 0) -> Any:
    """The operator CLI in process; ``code`` None: any exit code."""
    result = CliRunner().invoke(operator_cli, list(args))
    assert code is None or result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args else result.output


def provenance(report: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == "provenance")


def test_the_gym_audit_and_cli_flag_a_rolled_back_record(gym_and_store: tuple[Any, str]) -> None:
    gym, url = gym_and_store
    store: Store = gym.gateway.store
    anchor = store.record_anchor
    assert anchor is not None
    if gym.gateway.store.dialect == "sqlite":
        path = Path(gym.gateway.context.settings.data_dir) / FILE_NAME
        assert anchor.where == f"file {path.resolve()}"
    else:
        assert anchor.where.startswith("redis ")
    with httpx.Client(base_url=url, timeout=120) as client:
        run = create_key(client, budget_usd=1.0)
        for i in range(2):
            made = client.post("/records/v1/experiments", json={"name": f"e{i}"}, headers=bearer(run["key"]))
            assert made.status_code == 201, made.text
        old = snapshot_head(store, run["id"])
        for i in range(2, 5):
            client.post("/records/v1/experiments", json={"name": f"e{i}"}, headers=bearer(run["key"]))
        chain = client.get(f"/admin/v1/runs/{run['id']}/chain", headers=admin_headers()).json()
        assert (chain["ok"], chain["status"], chain["anchor"]["status"], chain["anchor"]["seq"]) == (
            True, "intact", "ok", 5)
        before = rsigym("audit", run["id"], "--json", code=None)  # the judge decides the rest
        assert provenance(before)["verdict"] == "pass" and before["chain"]["status"] == "intact"
        roll_back(store, run["id"], old)
        with bare(store) as alone:  # the store alone vouches for the shorter chain
            assert EventLog(alone, gym.gateway.internal_secret).verify(run["id"]).ok
        chain = client.get(f"/admin/v1/runs/{run['id']}/chain", headers=admin_headers()).json()
        assert chain["ok"] is False and [p["problem"] for p in chain["problems"]] == ["rolled_back"]
        agent_view = client.get("/records/v1/chain", headers=bearer(run["key"])).json()
        assert agent_view["ok"] is False and agent_view["status"] == "broken"
        assert set(agent_view["anchor"]) <= {"status", "seq", "heads"}  # not where the anchor lives
    report = rsigym("audit", run["id"], "--json", code=2)
    assert report["status"] == "flagged" and provenance(report)["verdict"] == "flag"
    assert any(f["category"] == "evaluation_tampering" and f["code"] == "EXECUTED"
               and "record chain: rolled_back at event 3" in f["evidence"] for f in provenance(report)["findings"])
    assert "BROKEN" in rsigym("records", run["id"], "chain", code=1)
    assert "record chain BROKEN" in rsigym("audit", run["id"], code=2)


def test_an_unverifiable_record_makes_the_audit_inconclusive(gym_and_store: tuple[Any, str]) -> None:
    gym, url = gym_and_store
    store: Store = gym.gateway.store
    with httpx.Client(base_url=url, timeout=120) as client:
        run = create_key(client, budget_usd=1.0)
    with bare(store) as alone:  # an event the anchor never saw (as a gym from before anchors wrote them)
        EventLog(alone, gym.gateway.internal_secret).record(run_id=run["id"], kind=TRAINING_JOB,
                                                            data={"job_id": "ftjob_1"})
    assert "UNVERIFIABLE" in rsigym("records", run["id"], "chain", code=1)
    report = rsigym("audit", run["id"], "--json", code=2)
    assert report["chain"]["status"] == "unverifiable" and report["status"] == "flagged"
    assert provenance(report)["verdict"] == "inconclusive" and "provenance" in report["inconclusive"]
    assert any(f["code"] == "INCONCLUSIVE" and "anchor" in f["evidence"] for f in provenance(report)["findings"])
    # the audit's own result is the first event the anchor sees: from there on the chain is vouched for
    assert "intact" in rsigym("records", run["id"], "chain")


class Flaky:
    """A file anchor whose first writes fail (a full disk, Redis restarting)."""

    def __init__(self, inner: FileAnchor, failures: int):
        self.inner, self.failures, self.where = inner, failures, inner.where

    def advance(self, marks: dict[str, Mark]) -> list[str]:
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        return self.inner.advance(marks)

    def read(self, run_id: str) -> list[Mark]:
        return self.inner.read(run_id)

    def release(self) -> None:
        self.inner.release()


def test_a_failed_anchor_write_is_retried_and_an_idle_writer_lets_go(tmp_path: Path) -> None:
    file = FileAnchor(tmp_path / FILE_NAME, SECRET)
    anchor = RecordAnchor(Flaky(file, failures=2))
    anchor.RETRY_S, anchor.IDLE_S = (0.01, 0.01, 0.01, 0.01), 0.2
    anchor.note("run_a", 1, "a" * 64)
    anchor.note("run_a", 2, "b" * 64)
    assert not anchor.flush(5)  # the first try failed: a check does not wait on a failing anchor ...
    deadline = time.monotonic() + 5
    while not anchor.flush(1) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [m.seq for m in anchor.read("run_a")] == [2]  # ... which is retried: coalesced, written after 2 failures
    while anchor._thread is not None and time.monotonic() < deadline:  # noqa: SLF001
        time.sleep(0.05)
    assert anchor._thread is None and file._fd is None  # noqa: SLF001 - idle: thread ended, file closed
    anchor.note("run_a", 3, "c" * 64)  # and starts again
    assert anchor.flush(5) and [m.seq for m in FileAnchor(tmp_path / FILE_NAME, SECRET).read("run_a")] == [2, 3]
    anchor.close()
