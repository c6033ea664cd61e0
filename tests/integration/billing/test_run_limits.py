"""Run limits (issue 12 item 3): a run's wall-clock deadline and tokens-per-minute limits.

After the deadline every key of the run is refused ``run_ended`` with nothing charged, the
reaper's pass stops the run's training jobs and sandboxes through their cancel paths (no hold
left ``reserved``), submissions are closed even at the service, and ``run.ended`` is on the
run's chain. A token limit never admits more than its worst-case tokens in a minute, however
many calls race for it, and a child key cannot give itself a higher limit.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from billing import deadlines, rate_limits
from kit.errors import RunEnded
from kit.identity import Identity
from services.records.events import RUN_ENDED, EventLog
from services.rollout.metering import estimate_chat_tokens
from services.sandbox.tables import SandboxRow
from services.training.tables import TrainingJob
from storage.tables import LedgerEntry
from tests.conftest import admin_headers, bearer, client_for, create_key
from tests.fakes.live_gym import harness_archive
from tests.fakes.servers import serve_gym

CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 8}
ROWS = [{"messages": [{"role": "user", "content": f"Repeat: red lion {i}"},
                      {"role": "assistant", "content": f"red lion {i}"}]} for i in range(8)]
RAW = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


def _ledger_rows(gym: Any, run_id: str, status: str | None = None) -> int:
    with gym.gateway.store.transaction() as s:
        q = select(func.count()).select_from(LedgerEntry).where(LedgerEntry.run_id == run_id)
        return int(s.scalar(q.where(LedgerEntry.status == status) if status else q) or 0)


def _end_now(client: Any, key_id: str) -> dict[str, Any]:
    r = client.post(f"/admin/v1/keys/{key_id}/deadline", json={"deadline_s": -1}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


# -- the deadline -----------------------------------------------------------------------------


def test_after_the_deadline_every_call_of_the_run_and_its_child_is_refused_uncharged(make_gym: Any, store: Any) -> None:
    gym = make_gym(store)
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0)
    child = client.post("/v1/keys", json={"name": "worker"}, headers=bearer(run["key"]))
    assert child.status_code == 201, child.text
    assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(run["key"])).status_code == 200
    spent_before = client.get(f"/admin/v1/keys/{run['id']}", headers=admin_headers()).json()["spent_usd"]
    rows_before = _ledger_rows(gym, run["id"])

    view = _end_now(client, run["id"])
    assert view["ends_at"] is not None

    for key in (run["key"], child.json()["key"]):
        calls = [client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key)),
                 client.get("/training/v1/jobs", headers=bearer(key)),
                 client.post("/training/v1/datasets", content=RAW, headers=bearer(key)),
                 client.get("/records/v1/events", headers=bearer(key)),
                 client.get("/v1/balance", headers=bearer(key)),
                 client.post("/v1/keys", json={"name": "late"}, headers=bearer(key))]
        for r in calls:
            assert r.status_code == 403, (r.request.url, r.text)
            assert r.json()["error"]["type"] == "run_ended"
    after = client.get(f"/admin/v1/keys/{run['id']}", headers=admin_headers()).json()
    assert after["spent_usd"] == spent_before and after["reserved_usd"] == 0
    assert _ledger_rows(gym, run["id"]) == rows_before  # not even a reservation was opened

    # The operator moves the deadline: the run works again at once (no stale cache either way).
    moved = client.post(f"/admin/v1/keys/{run['id']}/deadline", json={"deadline_s": 3600}, headers=admin_headers())
    assert moved.status_code == 200
    assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(run["key"])).status_code == 200


def test_a_cached_principal_is_refused_by_the_clock_of_the_call(gym: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0, deadline_s=3600)
    assert run["ends_at"] is not None
    assert client.get("/training/v1/jobs", headers=bearer(run["key"])).status_code == 200  # cached now
    later = datetime.now(UTC) + timedelta(hours=2)
    monkeypatch.setattr(deadlines, "utcnow", lambda: later)
    r = client.get("/training/v1/jobs", headers=bearer(run["key"]))
    assert r.status_code == 403 and r.json()["error"]["type"] == "run_ended"


def test_deadline_requests_are_validated(gym: Any) -> None:
    client = client_for(gym)
    both = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1, "deadline_s": 60,
                                               "ends_at": "2030-01-01T00:00:00Z"}, headers=admin_headers())
    assert both.status_code == 422
    naive = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1, "ends_at": "2030-01-01T00:00:00"},
                        headers=admin_headers())
    assert naive.status_code == 422
    run = create_key(client, budget_usd=1.0)
    child = client.post("/v1/keys", json={"name": "w"}, headers=bearer(run["key"])).json()
    r = client.post(f"/admin/v1/keys/{child['id']}/deadline", json={"deadline_s": 60}, headers=admin_headers())
    assert r.status_code == 409  # a deadline belongs to the run
    assert deadlines.parse_duration("2h") == 7200 and deadlines.parse_duration("90") == 90
    with pytest.raises(ValueError):
        deadlines.parse_duration("soon")


def test_cli_keys_create_deadline(gym: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ops.cli import keys
    from ops.cli import main as cli

    client = client_for(gym)

    def call(method: str, path: str, data_dir: Any, url: Any, **kw: Any) -> Any:
        r = client.request(method, path, headers=admin_headers(), **kw)
        assert r.status_code == 201, r.text
        return r.json()

    monkeypatch.setattr(keys, "admin_request", call)
    before = datetime.now(UTC)
    out = CliRunner().invoke(cli.app, ["keys", "create", "--track", "joint", "--budget", "1", "--deadline", "2h", "--json"])
    assert out.exit_code == 0, out.output
    made = client.get(f"/admin/v1/keys/{json.loads(out.output)['id']}", headers=admin_headers()).json()
    ends_at = datetime.fromisoformat(made["ends_at"])
    assert before + timedelta(hours=2) <= ends_at <= datetime.now(UTC) + timedelta(hours=2)
    bad = CliRunner().invoke(cli.app, ["keys", "create", "--track", "joint", "--budget", "1", "--deadline", "soon"])
    assert bad.exit_code == 2


def _wait(predicate: Any, what: str, timeout: float = 300) -> None:
    stop = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > stop:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _job(gym: Any, job_id: str) -> TrainingJob:
    with gym.gateway.store.transaction() as s:
        job = s.get(TrainingJob, job_id)
        s.expunge(job)
        return job


def _sandbox(gym: Any, sandbox_id: str) -> SandboxRow:
    with gym.gateway.store.transaction() as s:
        row = s.get(SandboxRow, sandbox_id)
        s.expunge(row)
        return row


def test_the_reaper_pass_stops_jobs_and_sandboxes_and_closes_submissions(gym: Any) -> None:
    client = client_for(gym)
    run = client.post("/admin/v1/keys", headers=admin_headers(), json={  # no track: a submission needs nothing
        "policy": {"services": {s: {} for s in ("training", "sandbox", "evaluation", "records")}},
        "budget_usd": 5.0}).json()
    agent = bearer(run["key"])
    dataset = client.post("/training/v1/datasets", content=RAW, headers=agent)
    assert dataset.status_code == 201, dataset.text
    job = client.post("/training/v1/jobs", headers=agent, json={
        "datasets": [dataset.json()["id"]], "base_model": "tiny", "steps": 5000, "batch_size": 4, "max_length": 64,
        "checkpoint_every": 10_000})
    assert job.status_code in (200, 201), job.text
    job_id = job.json()["id"]
    _wait(lambda: (_job(gym, job_id).step or 0) >= 1, "the training job's first step")
    harness = client.post("/evaluation/v1/harnesses", content=harness_archive("mine", "echo 0 > /app/answer.txt\n"),
                          headers=agent)
    assert harness.status_code == 201, harness.text
    submission = {"harness": harness.json()["id"]}
    early = client.post("/evaluation/v1/submissions", json=submission, headers=agent)
    assert early.status_code == 201, early.text  # submissions are open before the deadline
    sandbox_id = None
    if shutil.which("bwrap") is not None:
        created = client.post("/sandbox/v2/sandboxes", headers={"X-API-Key": run["key"]},
                              json={"templateID": "base", "timeout": 300})
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["sandboxID"]

    _end_now(client, run["id"])
    # Refused at the gateway …
    late = client.post("/evaluation/v1/submissions", json=submission, headers=agent)
    assert late.status_code == 403 and late.json()["error"]["type"] == "run_ended"
    # … and at the service, should a call slip past the gateway.
    evaluation = gym.service_apps["evaluation"].state.evaluation
    identity = Identity(request_id="req_x", key_id=run["id"], run_id=run["id"], service="evaluation",
                        operation="submissions.create", issued_at=time.time())
    with pytest.raises(RunEnded):
        evaluation.submit(identity, submission)

    ended = client.post("/admin/v1/runs/end-expired", headers=admin_headers())
    assert ended.status_code == 200, ended.text
    [mine] = [e for e in ended.json()["data"] if e["run_id"] == run["id"]]
    assert mine["jobs_cancelled"] == 1
    if sandbox_id is not None:
        _wait(lambda: _sandbox(gym, sandbox_id).state != "running", "the sandbox to end")
        row = _sandbox(gym, sandbox_id)
        if mine["sandboxes_killed"] == 1:
            assert (row.state, row.end_reason) == ("killed", "the run's deadline passed")
        else:  # this host SIGKILLs sandboxes now and then; one that died before the pass was ended by its supervisor
            assert mine["sandboxes_killed"] == 0 and row.state == "failed", (row.state, row.end_reason, mine)
        assert row.ended_at is not None
    again = client.post("/admin/v1/runs/end-expired", headers=admin_headers()).json()["data"]
    assert all(e["run_id"] != run["id"] for e in again)  # ended once, whoever asks again

    _wait(lambda: _job(gym, job_id).status not in ("queued", "running"), "the job to stop")
    stopped = _job(gym, job_id)
    assert stopped.status == "cancelled" and stopped.step < 5000
    assert _ledger_rows(gym, run["id"], "reserved") == 0  # every hold settled or released
    assert _ledger_rows(gym, run["id"], "settled") >= 1  # the steps it did were paid for

    events = EventLog(gym.gateway.store, gym.gateway.internal_secret).events(run["id"], kinds=(RUN_ENDED,))
    assert len(events) == 1
    assert events[0].data["jobs_cancelled"] == 1 and events[0].data["ends_at"]
    chain = client.get(f"/admin/v1/runs/{run['id']}/chain", headers=admin_headers())
    assert chain.status_code == 200 and chain.json()["ok"] is True, chain.text


# -- tokens per minute ---------------------------------------------------------------------


async def _fire(url: str, key: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        return await asyncio.gather(*(client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key))
                                      for _ in range(n)))


def test_concurrent_calls_never_exceed_the_tokens_per_minute(make_gym: Any, store: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    gym = make_gym(store)
    per_call = estimate_chat_tokens(CHAT, gym.gateway.context)
    limit = 3 * per_call + per_call // 2
    minute = datetime(2026, 12, 1, 12, 0, 20, tzinfo=UTC)  # one minute for the whole burst, 40 s before the next
    monkeypatch.setattr(rate_limits, "utcnow", lambda: minute)
    with serve_gym(gym) as url, httpx.Client(base_url=url) as client:
        run = client.post("/admin/v1/keys", headers=admin_headers(), json={
            "policy": {"services": {"rollout": {"tokens_per_minute": limit}}}, "budget_usd": 1.0}).json()
        responses = asyncio.run(_fire(url, run["key"], 20))
        statuses = Counter(r.status_code for r in responses)
        assert statuses == {200: 3, 429: 17}, statuses
        for r in responses:
            if r.status_code == 429:
                assert r.json()["error"]["type"] == "rate_limited"
                assert r.headers["Retry-After"] == "40"
        rows = client.get(f"/admin/v1/keys/{run['id']}/ledger", headers=admin_headers()).json()["data"]
    assert [r["status"] for r in rows] == ["settled"] * 3  # refused calls charged nothing, left no hold
    assert rate_limits.used_tokens(gym.gateway.store, run["id"], now=minute) == 3 * per_call <= limit


def test_a_child_cannot_raise_its_token_limit_and_both_limits_apply(make_gym: Any, store: Any) -> None:
    gym = make_gym(store)
    client = client_for(gym)
    per_call = estimate_chat_tokens(CHAT, gym.gateway.context)
    run = client.post("/admin/v1/keys", headers=admin_headers(), json={
        "policy": {"services": {"rollout": {"tokens_per_minute": 10 * per_call}}}, "budget_usd": 1.0}).json()
    wider = {"tokens_per_minute": 100 * per_call}
    r = client.post("/v1/keys", headers=bearer(run["key"]), json={"policy": {"services": {"rollout": wider}}})
    assert r.status_code == 403, r.text
    assert r.json()["error"]["param"] == "services.rollout.tokens_per_minute"
    # a child that leaves the limit out gets its parent's (it cannot shed it)
    r = client.post("/v1/keys", headers=bearer(run["key"]), json={"policy": {"services": {"rollout": {}}}})
    assert r.status_code == 201 and r.json()["policy"]["services"]["rollout"]["tokens_per_minute"] == 10 * per_call
    child = client.post("/v1/keys", headers=bearer(run["key"]),
                        json={"policy": {"services": {"rollout": {"tokens_per_minute": per_call}}}})
    assert child.status_code == 201, child.text
    key = child.json()["key"]
    assert client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key)).status_code == 200
    second = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key))
    if second.status_code == 200:  # the minute turned between the two calls: the third must be refused
        second = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key))
    assert second.status_code == 429 and second.json()["error"]["type"] == "rate_limited"
    assert 1 <= int(second.headers["Retry-After"]) <= 60
    # One call bigger than the whole limit can never pass: a 422, not a retry.
    huge = client.post("/rollout/v1/chat/completions", json={**CHAT, "max_tokens": 4 * per_call}, headers=bearer(key))
    assert huge.status_code in (422, 403), huge.text
