"""`GET /admin/v1/runs/{run_id}/timeline` on the real embedded gym (SQLite and PostgreSQL): metered
rollout calls show up as the run's spend by service, agreeing with its ledger and balance; time to
the first training job, research hours and experiment counts come from the store; only the
operator reads it, and only runs (root keys) have one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from kit.ids import new_id
from kit.settings import GymSettings
from ops.cli.admin_client import AdminClient
from services.evaluation.report import timeline_from_api
from services.records.events import TRAINING_JOB, EventLog, RecordEvent
from services.records.experiments import Experiment, ExperimentRegistry
from services.training.tables import TrainingJob
from storage.store import Store
from tests.conftest import ADMIN_TOKEN, admin_headers, bearer, client_for, create_key
from tests.fakes.servers import serve_gym

CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 8}


@pytest.fixture
def on_store(make_gym: Callable[..., Any], store: Store) -> Any:
    """An embedded gym on the parametrised store (SQLite, PostgreSQL)."""
    return make_gym(store=store)


def _timeline(client: Any, run_id: str) -> Any:
    return client.get(f"/admin/v1/runs/{run_id}/timeline", headers=admin_headers())


def _chat(client: Any, key: str) -> float:
    r = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(key))
    assert r.status_code == 200, r.text
    return float(r.headers["X-RSIGym-Cost-USD"])


def test_rollout_spend_shows_by_service_and_matches_the_ledger(on_store: Any) -> None:
    client = client_for(on_store)
    run = create_key(client, 1.0)
    other = create_key(client, 1.0)
    costs = [_chat(client, run["key"]), _chat(client, run["key"])]
    _chat(client, other["key"])  # another run's spend never shows in this one

    r = _timeline(client, run["id"])
    assert r.status_code == 200, r.text
    tl = r.json()
    ledger = client.get(f"/admin/v1/keys/{run['id']}/ledger", headers=admin_headers()).json()["data"]
    balance = client.get("/v1/balance", headers=bearer(run["key"])).json()

    assert list(tl["spend_by_service"]) == ["rollout"]
    rollout = tl["spend_by_service"]["rollout"]
    assert [p["usd"] for p in rollout["points"]] == pytest.approx([costs[0], costs[0] + costs[1]])
    assert rollout["total_usd"] == pytest.approx(sum(costs))
    assert tl["spend_usd"] == pytest.approx(sum(row["actual_usd"] for row in ledger))
    assert tl["spend_usd"] == pytest.approx(balance["spent_usd"]) and tl["spend_usd"] > 0
    hours = [p["hours"] for p in rollout["points"]]
    assert hours == sorted(hours) and hours[0] >= 0

    assert tl["run_id"] == run["id"] and tl["started_at"] == run["created_at"]
    assert tl["first_training_job_at"] is None and tl["time_to_first_training_job_s"] is None
    assert tl["experiments"] == {"total": 0, "pending": 0, "accepted": 0, "flagged": 0}
    assert tl["first_activity_at"] >= tl["started_at"] and tl["last_activity_at"] >= tl["first_activity_at"]
    assert 0 <= tl["research_hours"] < 1


def test_training_jobs_experiments_and_events_shape_the_timeline(on_store: Any) -> None:
    client, gw = client_for(on_store), on_store.gateway
    run = create_key(client, 1.0)
    child = client.post("/v1/keys", json={"name": "worker"}, headers=bearer(run["key"])).json()
    started = datetime.fromisoformat(run["created_at"])
    _chat(client, child["key"])  # a child key's spend is its run's

    events = EventLog(gw.store, gw.internal_secret)
    with gw.store.transaction() as s:
        made = [ExperimentRegistry(events).create(s, run_id=run["id"], owner_key_id=child["id"], name=f"e{i}",
                                                  parents=[], implicit=False).id for i in range(4)]
        for exp_id, status in zip(made, ["accepted", "flagged", "flagged", "pending"], strict=True):
            s.execute(update(Experiment).where(Experiment.id == exp_id).values(status=status))
        s.add(TrainingJob(id=new_id("trj"), run_id=run["id"], key_id=child["id"], status="succeeded",
                          base_model="tiny", dataset_ids=[], config={}, config_hash="0" * 64, total_steps=2,
                          created_at=started + timedelta(hours=2), finished_at=started + timedelta(hours=3)))
        later = dict(prev_hash="0" * 64, hash="0" * 64, data={}, kind=TRAINING_JOB)
        s.add(RecordEvent(run_id=run["id"], seq=1000, key_id=child["id"], created_at=started + timedelta(hours=4),
                          **later))  # the agent's activity stretches research hours ...
        s.add(RecordEvent(run_id=run["id"], seq=1001, key_id=None, created_at=started + timedelta(hours=9),
                          **later))  # ... the operator's own later records (an audit) do not

    tl = _timeline(client, run["id"]).json()
    assert tl["time_to_first_training_job_s"] == pytest.approx(7200.0)
    assert tl["first_training_job_at"] == (started + timedelta(hours=2)).isoformat()
    assert tl["experiments"] == {"total": 4, "accepted": 1, "flagged": 2, "pending": 1}
    assert tl["last_activity_at"] == (started + timedelta(hours=4)).isoformat()
    assert tl["research_hours"] == pytest.approx(4.0, abs=0.01)  # first call (seconds after start) to hour 4
    assert list(tl["spend_by_service"]) == ["rollout"]

    # the CLI's client reads the same answer over HTTP, and the report's parser takes it
    with serve_gym(on_store) as url:
        parsed = timeline_from_api(AdminClient(GymSettings(admin_token=ADMIN_TOKEN), url).timeline(run["id"]))
    assert parsed.experiments["flagged"] == 2 and parsed.service_totals()["rollout"] == pytest.approx(tl["spend_usd"])


def test_only_the_operator_reads_a_timeline_and_only_of_runs(on_store: Any) -> None:
    client = client_for(on_store)
    run = create_key(client, 1.0)
    child = client.post("/v1/keys", json={"name": "worker"}, headers=bearer(run["key"])).json()
    _chat(client, run["key"])

    as_run = client.get(f"/admin/v1/runs/{run['id']}/timeline", headers=bearer(run["key"]))
    assert as_run.status_code == 401 and "spend_by_service" not in as_run.text
    assert client.get(f"/admin/v1/runs/{run['id']}/timeline").status_code == 401

    for missing in (child["id"], "key_doesnotexist"):
        r = _timeline(client, missing)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
