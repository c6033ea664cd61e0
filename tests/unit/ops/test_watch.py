"""`rsigym watch RUN`: the frame rendered from a snapshot (pure), the stall warning, and the
whole path through a real embedded gym on loopback, including the admin jobs route it reads."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from kit.ids import new_id
from kit.settings import StoreSettings
from ops.cli.main import app as operator_cli
from ops.cli.watch import render, turn_summary
from services.evaluation.tables import EvaluationJob
from services.records import agent_turns
from services.training.tables import TrainingJob
from storage.store import Store, sqlite_url
from tests.conftest import ADMIN_TOKEN, admin_headers, bearer, create_key
from tests.fakes.servers import serve_gym

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def snapshot(*, last_call: datetime | None = NOW - timedelta(minutes=1), created: datetime = NOW - timedelta(hours=2),
             **over: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "now": NOW.isoformat(),
        "run": {"id": "key_run1", "name": "alpha", "track": "joint", "status": "active", "budget_usd": 50.0,
                "spent_usd": 12.3456, "reserved_usd": 0.5, "remaining_usd": 37.1544,
                "created_at": created.isoformat(), "ends_at": None},
        "spend_by_service": {"rollout": 2.25, "training": 10.0956},
        "agent_model": {"id": "key_meter", "budget_usd": 20.0, "spent_usd": 3.75, "reserved_usd": 0.0,
                        "remaining_usd": 16.25},
        "turns": [{"at": (NOW - timedelta(minutes=1)).isoformat(), "model": "agent-sonnet", "cost_usd": 0.0421,
                   "user": "train on the filtered set", "answer": "Starting job trj_1 now"}],
        "turn_count": 7,
        "jobs": [{"id": "trj_abc", "kind": "training", "status": "running", "model": "tiny", "done": 3, "total": 10,
                  "progress": 0.3}],
        "scores": [{"at": NOW.isoformat(), "job_id": "evj_1", "benchmark": "gsm-mini", "model": "ckpt_9",
                    "harness": "minimal", "purpose": "agent", "status": "succeeded", "score": 0.75}],
        "audit": {"id": "aud_1", "status": "flagged", "hacking_rate": 0.25, "created_at": NOW.isoformat()},
        "last_agent_call_at": None if last_call is None else last_call.isoformat(),
        "errors": [],
    }
    snap.update(over)
    return snap


def frame(snap: dict[str, Any], stall_minutes: float = 10) -> str:
    console = Console(record=True, width=220, file=io.StringIO())
    console.print(render(snap, stall_minutes=stall_minutes))
    return console.export_text()


def test_frame_shows_spend_turns_jobs_scores_and_audit() -> None:
    text = frame(snapshot())
    assert "key_run1" in text and "track joint" in text
    assert "$12.3456" in text and "$37.1544" in text and "$50.0000" in text  # service spend, remaining, budget
    assert "rollout" in text and "$2.2500" in text and "$10.0956" in text  # by service
    assert "agent model" in text and "$3.7500" in text and "$16.2500" in text  # agent-model meter apart
    assert "train on the filtered set" in text and "Starting job trj_1 now" in text and "agent-sonnet" in text
    assert "last 1 of 7" in text
    assert "trj_abc" in text and "3/10 (30%)" in text
    assert "gsm-mini" in text and "0.750" in text
    assert "flagged" in text and "0.25" in text
    assert "STALLED" not in text


def test_a_stalled_run_gets_the_warning_and_a_fresh_one_does_not() -> None:
    stalled = frame(snapshot(last_call=NOW - timedelta(minutes=25)), stall_minutes=10)
    assert "STALLED: no agent call for 25 min (threshold 10 min)" in stalled
    assert "STALLED" not in frame(snapshot(last_call=NOW - timedelta(minutes=9)), stall_minutes=10)
    # never called at all: measured from the run's creation
    assert "STALLED" in frame(snapshot(last_call=None, created=NOW - timedelta(minutes=30)))
    assert "STALLED" not in frame(snapshot(last_call=None, created=NOW - timedelta(minutes=2)))


def test_a_run_without_agent_meter_turns_or_audit_renders_plainly() -> None:
    text = frame(snapshot(agent_model=None, turns=[], turn_count=0, jobs=[], scores=[], audit=None,
                          errors=["audits: service_unavailable: records down"]))
    assert "no meter" in text and "not audited yet" in text and "records down" in text


def test_turn_summary_reads_both_apis_and_truncates() -> None:
    openai_turn = {"created_at": NOW.isoformat(), "model": "m", "cost_usd": 0.1,
                   "request": {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "x" * 500},
                                            {"role": "assistant", "content": "prior"}]},
                   "response": {"choices": [{"message": {"content": "the answer"}}]}}
    s = turn_summary(openai_turn)
    assert s["answer"] == "the answer" and len(s["user"]) == 100 and s["user"].endswith("…")
    anthropic_turn = {**openai_turn, "request": {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
                      "response": {"content": [{"type": "text", "text": "hello there"}]}}
    assert turn_summary(anthropic_turn)["user"] == "hi" and turn_summary(anthropic_turn)["answer"] == "hello there"
    assert turn_summary({**openai_turn, "response": {"text": "streamed"}})["answer"] == "streamed"


# -- through a real embedded gym -------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(sqlite_url(tmp_path / "db"), StoreSettings())
    s.migrate()
    yield s
    s.dispose()


@pytest.fixture
def served(make_gym: Callable[..., Any], store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    gym = make_gym(store=store)
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        monkeypatch.setenv("COLUMNS", "220")
        yield url


def add_training_job(store: Store, run_id: str, status: str = "running") -> str:
    job_id = new_id("trj")
    with store.transaction() as s:
        s.add(TrainingJob(id=job_id, run_id=run_id, key_id=run_id, status=status, base_model="tiny",
                          dataset_ids=[], config={}, config_hash="0" * 64, total_steps=8, step=2))
    return job_id


def add_evaluation_job(store: Store, run_id: str, status: str = "queued") -> str:
    job_id = new_id("evj")
    with store.transaction() as s:
        s.add(EvaluationJob(id=job_id, run_id=run_id, key_id=run_id, purpose="agent", benchmark="bench-x", split="dev",
                            model="tiny", harness="minimal", attempts=1, sampling={}, task_ids=["t1"],
                            gateway_url="http://x", status=status, trials_total=4, trials_done=1))
    return job_id


def test_watch_once_against_a_gym(served: str, store: Store) -> None:
    with httpx.Client(base_url=served, timeout=60) as c:
        run = create_key(c, budget_usd=5.0, name="watched", agent_budget_usd=2.0)
        other = create_key(c, budget_usd=5.0, name="other")
        chat = {"model": "teacher", "messages": [{"role": "user", "content": "hello"}]}
        assert c.post("/rollout/v1/chat/completions", json=chat, headers=bearer(run["key"])).status_code == 200
        spend = c.get(f"/admin/v1/runs/{run['id']}/timeline", headers=admin_headers()).json()["spend_by_service"]
    rollout_usd = spend["rollout"]["total_usd"]
    assert rollout_usd > 0
    agent_turns.record_turn(store, run_id=run["id"], key_id=run["id"], request_id=None, api="openai", model="agent-x",
                            stream=False, request={"messages": [{"role": "user", "content": "what next?"}]},
                            response={"choices": [{"message": {"content": "train a model"}}]}, usage={}, cost_nusd=0)
    mine = add_training_job(store, run["id"])
    theirs = add_training_job(store, other["id"])

    result = CliRunner().invoke(operator_cli, ["watch", run["id"], "--once"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert run["id"] in out
    assert f"${rollout_usd:,.9f}" in out  # the rollout call's charge, by service
    assert "$2.0000" in out  # the agent-model meter's budget
    assert "what next?" in out and "train a model" in out
    assert mine in out and "2/8 (25%)" in out and theirs not in out
    assert "STALLED" not in out
    assert "not audited yet" in out


def test_watch_of_an_unknown_run_fails_cleanly(served: str) -> None:
    result = CliRunner().invoke(operator_cli, ["watch", "key_nope", "--once"])
    assert result.exit_code == 1
    assert "not found" in result.output


def test_jobs_route_lists_only_the_runs_unfinished_jobs_and_only_to_the_operator(served: str, store: Store) -> None:
    with httpx.Client(base_url=served, timeout=60) as c:
        run = create_key(c, name="a")
        other = create_key(c, name="b")
        training = add_training_job(store, run["id"])
        evaluation = add_evaluation_job(store, run["id"])
        add_training_job(store, run["id"], status="succeeded")
        foreign = add_training_job(store, other["id"])

        body = c.get(f"/admin/v1/runs/{run['id']}/jobs", headers=admin_headers()).json()
        assert {j["id"] for j in body["data"]} == {training, evaluation}
        by_id = {j["id"]: j for j in body["data"]}
        assert by_id[training]["progress"] == 0.25 and by_id[evaluation]["kind"] == "evaluation"
        assert by_id[evaluation]["benchmark"] == "bench-x"

        # the other run's agent, with its own key, learns nothing about this run's jobs
        for headers in ({}, bearer(other["key"]), bearer(run["key"])):
            refused = c.get(f"/admin/v1/runs/{run['id']}/jobs", headers=headers)
            assert refused.status_code in (401, 403)
            assert training not in refused.text and foreign not in refused.text
        assert c.get("/admin/v1/runs/key_nope/jobs", headers=admin_headers()).status_code == 404
