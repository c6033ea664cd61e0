"""Role-scoped reads of the records service, played by the attacker.

A worker child key tries to read its sibling's experiments, events and annotations; a reviewer
scoped to two workers tries to reach a third; another run's key tries everything; a child
tries to mint a grandchild that reads more than itself; an agent tries to write a platform
event. Each test asserts what the attacker actually got."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gateway.proxy import operator_call
from ops.builder import Gym
from services.records.events import CHECKPOINT_REGISTERED, EventLog
from services.records.experiments import ExperimentRegistry
from tests.conftest import bearer, client_for, create_key


def log_of(gym: Gym) -> EventLog:
    return EventLog(gym.gateway.context.store, gym.gateway.context.internal_secret)


def mint(client: httpx.Client, parent_key: str, name: str, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name}
    if policy is not None:
        body["policy"] = policy
    response = client.post("/v1/keys", json=body, headers=bearer(parent_key))
    assert response.status_code == 201, response.text
    return response.json()


def records_policy(owners: list[str] | None) -> dict[str, Any]:
    return {"services": {"records": {"owners": owners}}}


class Team:
    """One run: its root key, three workers and their experiments, each with an event-backed
    checkpoint and an annotation."""

    def __init__(self, gym: Gym, client: httpx.Client):
        self.gym, self.client = gym, client
        self.root = create_key(client)
        self.workers = [mint(client, self.root["key"], f"worker{i}") for i in range(3)]
        self.exps: list[str] = []
        self.ckpts: list[str] = []
        self.notes: list[str] = []
        for i, w in enumerate(self.workers):
            exp = self.post(w, "/records/v1/experiments", {"name": f"secret plan {i}"})
            assert exp.status_code == 201, exp.text
            self.exps.append(exp.json()["id"])
            ckpt = f"ckpt_w{i}_{self.root['id'][-6:]}"
            log_of(gym).record(run_id=self.root["id"], kind=CHECKPOINT_REGISTERED, key_id=w["id"],
                               experiment_id=self.exps[-1],
                               data={"checkpoint_id": ckpt, "job_id": f"ftjob_{i}", "base_model": "tiny",
                                     "parent_checkpoint": None, "weights_hash": "w", "dataset_hashes": [],
                                     "config_hash": "c", "step": 1})
            self.ckpts.append(ckpt)
            note = self.post(w, "/records/v1/annotations", {"kind": "finding", "claim": f"finding {i}",
                                                           "experiment_ids": [self.exps[-1]]})
            assert note.status_code == 201, note.text
            self.notes.append(note.json()["id"])

    def post(self, who: dict[str, Any], path: str, body: dict[str, Any]) -> httpx.Response:
        return self.client.post(path, json=body, headers=bearer(who["key"]))

    def get(self, who: dict[str, Any], path: str, **params: Any) -> httpx.Response:
        return self.client.get(path, params=params, headers=bearer(who["key"]))

    def seen(self, who: dict[str, Any]) -> dict[str, set[str]]:
        """Everything ``who`` can list: experiments, event experiment ids and key ids, annotations."""
        events = self.get(who, "/records/v1/events", limit=1000).json()["data"]
        return {
            "experiments": {x["id"] for x in self.get(who, "/records/v1/experiments").json()["data"]},
            "event_experiments": {e["experiment_id"] for e in events} - {None},
            "event_keys": {e["key_id"] for e in events} - {None},
            "annotations": {n["id"] for n in self.get(who, "/records/v1/annotations").json()["data"]},
        }


@pytest.fixture
def team(gym: Gym) -> Any:
    client = client_for(gym)
    yield Team(gym, client)
    client.close()


def not_found_alike(hidden: httpx.Response, missing: httpx.Response) -> None:
    """A hidden record answers exactly like one that does not exist (ids aside)."""
    assert hidden.status_code == missing.status_code == 404, (hidden.text, missing.text)
    a, b = hidden.json()["error"], missing.json()["error"]
    assert (a["type"], a["param"]) == (b["type"], b["param"])
    assert "secret plan" not in hidden.text


def test_a_worker_cannot_read_its_siblings_records(team: Team) -> None:
    w0, w1 = team.workers[0], team.workers[1]
    seen = team.seen(w0)
    assert seen["experiments"] == {team.exps[0]}
    assert seen["event_experiments"] == {team.exps[0]} and seen["event_keys"] == {w0["id"]}
    assert seen["annotations"] == {team.notes[0]}

    sibling, mine = team.exps[1], team.exps[0]
    not_found_alike(team.get(w0, f"/records/v1/experiments/{sibling}"), team.get(w0, "/records/v1/experiments/exp_x"))
    not_found_alike(team.get(w0, f"/records/v1/experiments/{mine}/diff/{sibling}"),
                    team.get(w0, f"/records/v1/experiments/{mine}/diff/exp_x"))
    not_found_alike(team.get(w0, f"/records/v1/experiments/{sibling}/diff/{mine}"),
                    team.get(w0, f"/records/v1/experiments/exp_x/diff/{mine}"))
    not_found_alike(team.get(w0, "/records/v1/events", experiment=sibling),
                    team.get(w0, "/records/v1/events", experiment="exp_x"))
    not_found_alike(team.get(w0, "/records/v1/annotations", experiment=sibling),
                    team.get(w0, "/records/v1/annotations", experiment="exp_x"))
    not_found_alike(team.get(w0, f"/records/v1/checkpoints/{team.ckpts[1]}/lineage"),
                    team.get(w0, "/records/v1/checkpoints/ckpt_x/lineage"))
    assert team.get(w0, f"/records/v1/checkpoints/{team.ckpts[0]}/lineage").status_code == 200

    # Nor can it build on, or write claims about, what it cannot see — and nothing is written.
    before = team.seen(team.root)
    not_found_alike(team.post(w0, "/records/v1/experiments", {"name": "x", "parents": [sibling]}),
                    team.post(w0, "/records/v1/experiments", {"name": "x", "parents": ["exp_x"]}))
    not_found_alike(team.post(w0, "/records/v1/annotations", {"kind": "review", "experiment_ids": [sibling]}),
                    team.post(w0, "/records/v1/annotations", {"kind": "review", "experiment_ids": ["exp_x"]}))
    assert team.seen(team.root) == before
    # The sibling's own view is untouched by the attempts.
    assert team.seen(w1)["experiments"] == {sibling}


def test_a_worker_sees_the_experiments_it_continues(team: Team) -> None:
    """Predecessors are visible: the platform attaches a worker's action to an experiment that
    continues the root's; the worker reads that parent, still not its siblings'."""
    root_exp = team.post(team.root, "/records/v1/experiments", {"name": "root baseline"}).json()["id"]
    log = log_of(team.gym)
    with log.store.transaction() as s:
        child = ExperimentRegistry(log).create(s, run_id=team.root["id"], owner_key_id=team.workers[0]["id"],
                                               name="continues", parents=[root_exp], implicit=True).id
    seen = team.seen(team.workers[0])["experiments"]
    assert seen == {team.exps[0], child, root_exp}
    assert team.get(team.workers[0], f"/records/v1/experiments/{root_exp}").status_code == 200
    assert root_exp not in team.seen(team.workers[1])["experiments"]


def test_a_reviewer_scoped_to_two_workers_reads_both_and_not_the_third(team: Team) -> None:
    w0, w1, w2 = team.workers
    reviewer = mint(team.client, team.root["key"], "reviewer", records_policy([w0["id"], w1["id"]]))
    seen = team.seen(reviewer)
    assert seen["experiments"] == {team.exps[0], team.exps[1]}
    assert seen["event_keys"] == {w0["id"], w1["id"]}
    assert seen["annotations"] == {team.notes[0], team.notes[1]}
    diff = team.get(reviewer, f"/records/v1/experiments/{team.exps[0]}/diff/{team.exps[1]}")
    assert diff.status_code == 200, diff.text
    review = team.post(reviewer, "/records/v1/annotations", {
        "kind": "review", "experiment_ids": [team.exps[0], team.exps[1]], "uncertainties": ["single seed"]})
    assert review.status_code == 201 and review.json()["key_id"] == reviewer["id"]

    not_found_alike(team.get(reviewer, f"/records/v1/experiments/{team.exps[2]}"),
                    team.get(reviewer, "/records/v1/experiments/exp_x"))
    not_found_alike(team.get(reviewer, f"/records/v1/checkpoints/{team.ckpts[2]}/lineage"),
                    team.get(reviewer, "/records/v1/checkpoints/ckpt_x/lineage"))
    assert team.seen(w2)["annotations"] == {team.notes[2]}  # the review of others is not w2's to read
    # A review naming a sibling's experiment stays hidden from w0 (it would reveal the sibling's
    # id); a review of w0's own work alone is w0's to read.
    own = team.post(reviewer, "/records/v1/annotations", {"kind": "review", "experiment_ids": [team.exps[0]]})
    assert team.seen(w0)["annotations"] == {team.notes[0], own.json()["id"]}


def test_another_runs_key_sees_nothing(gym: Gym, team: Team) -> None:
    other = create_key(team.client)
    seen = team.seen(other)
    assert seen == {"experiments": set(), "event_experiments": set(), "event_keys": set(), "annotations": set()}
    for path in (f"/records/v1/experiments/{team.exps[0]}", f"/records/v1/checkpoints/{team.ckpts[0]}/lineage",
                 f"/records/v1/experiments/{team.exps[0]}/diff/{team.exps[1]}"):
        assert team.get(other, path).status_code == 404, path
    assert team.get(other, "/records/v1/best-checkpoint").status_code == 404
    assert team.post(other, "/records/v1/experiments", {"name": "x", "parents": [team.exps[0]]}).status_code == 404
    assert team.post(other, "/records/v1/annotations",
                     {"kind": "finding", "claim": "x", "experiment_ids": [team.exps[0]]}).status_code == 404
    chain = team.get(other, "/records/v1/chain").json()
    assert chain["run_id"] == other["id"] and chain["events"] == 0
    # A key of the other run cannot be named as an owner either (same answer as a made-up id).
    for owner in (team.workers[0]["id"], "key_made_up"):
        refused = team.client.post("/v1/keys", json={"policy": records_policy([owner])}, headers=bearer(other["key"]))
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "services.records.owners"
        assert refused.json()["error"]["message"] == f"records owner {owner!r} is not a key of this run"


def test_a_child_cannot_mint_a_grandchild_that_reads_more_than_itself(team: Team) -> None:
    w0, w1, w2 = team.workers
    # A worker naming its sibling as an owner: refused, and no key exists afterwards.
    refused = team.client.post("/v1/keys", json={"policy": records_policy([w1["id"]])}, headers=bearer(w0["key"]))
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "services.records.owners"
    assert "key" not in refused.json()
    assert team.client.get("/v1/keys", headers=bearer(w0["key"])).json()["data"] == []

    reviewer = mint(team.client, team.root["key"], "reviewer", records_policy([w0["id"], w1["id"]]))
    wider = team.client.post("/v1/keys", json={"policy": records_policy([w0["id"], w2["id"]])},
                             headers=bearer(reviewer["key"]))
    assert wider.status_code == 403, wider.text
    narrower = mint(team.client, reviewer["key"], "sub-reviewer", records_policy([w0["id"]]))
    assert team.seen(narrower)["experiments"] == {team.exps[0]}
    # A grandchild under a worker may name keys of the worker's own subtree.
    helper = mint(team.client, w0["key"], "helper", records_policy(None))
    sub = mint(team.client, w0["key"], "sub", records_policy([helper["id"]]))
    assert team.seen(sub)["experiments"] == set()
    assert team.seen(w0)["experiments"] == {team.exps[0]}


def test_no_route_writes_a_platform_event(gym: Gym, team: Team) -> None:
    run_id = team.root["id"]
    before = [e.hash for e in log_of(gym).events(run_id)]
    forged = {"kind": "evaluation.job", "data": {"job_id": "x", "score": 1.0, "split": "official"},
              "experiment_id": team.exps[0]}
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        for path in ("/records/v1/events", f"/records/v1/events/{len(before)}", "/records/v1/chain"):
            response = team.client.request(method, path, content=json.dumps(forged),
                                           headers={**bearer(team.root["key"]), "content-type": "application/json"})
            assert response.status_code in (404, 405), (method, path, response.status_code)
            assert response.json()["type"] == "error"
    # Operator routes are not reachable with a run key.
    for path in (f"/records/v1/operator/runs/{run_id}/events", f"/records/v1/operator/runs/{run_id}/audit"):
        assert team.client.post(path, headers=bearer(team.root["key"])).status_code in (404, 405)
        assert team.client.get(path, headers=bearer(team.root["key"])).status_code in (404, 405)
    # Straight to the service, without the gateway's signature: refused.
    service = gym.service_apps["records"]
    direct = asyncio.run(_direct(service, run_id))
    assert direct.status_code == 401
    assert [e.hash for e in log_of(gym).events(run_id)] == before
    assert log_of(gym).verify(run_id).ok


async def _direct(app: Any, run_id: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://records") as c:
        return await c.get(f"/v1/operator/runs/{run_id}/events")


def test_operator_reads_any_run_and_nothing_else_does(gym: Gym, team: Team) -> None:
    run_id = team.root["id"]

    async def call(path: str) -> httpx.Response:
        return await operator_call(gym.gateway, "records", "GET", path, "req_test")

    experiments = asyncio.run(call(f"/v1/operator/runs/{run_id}/experiments"))
    assert experiments.status_code == 200
    assert {x["id"] for x in experiments.json()["data"]} == set(team.exps)
    events = asyncio.run(call(f"/v1/operator/runs/{run_id}/events")).json()
    assert {e["key_id"] for e in events["data"]} == {w["id"] for w in team.workers}
    chain = asyncio.run(call(f"/v1/operator/runs/{run_id}/chain")).json()
    assert chain["ok"] is True and chain["events"] == len(events["data"])
    assert asyncio.run(call(f"/v1/operator/runs/{team.workers[0]['id']}/events")).status_code == 404  # not a run
    assert asyncio.run(call("/v1/operator/audits")).json()["data"] == []


def test_a_decision_reacts_only_to_what_its_writer_may_read(team: Team) -> None:
    """A decision's edges (``reacts_to``: findings, reviews) obey the same scope as its evidence:
    a worker cannot pin its decision on a sibling's finding, and a hidden one answers like none."""
    w0, mine, sibling = team.workers[0], team.notes[0], team.notes[1]
    before = team.seen(team.root)
    decision = {"kind": "decision", "action": "branch", "rationale": "r", "experiment_ids": [team.exps[0]]}
    not_found_alike(team.post(w0, "/records/v1/annotations", {**decision, "reacts_to": [sibling]}),
                    team.post(w0, "/records/v1/annotations", {**decision, "reacts_to": ["ann_x"]}))
    assert team.seen(team.root) == before  # nothing written
    bad = team.post(w0, "/records/v1/annotations", {**decision, "action": "celebrate"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "action"
    made = team.post(w0, "/records/v1/annotations", {**decision, "reacts_to": [mine], "directions": ["more seeds"]})
    assert made.status_code == 201, made.text
    assert made.json()["reacts_to"] == [mine] and made.json()["directions"] == ["more seeds"]
    # the run key (the lead) reacts to anything of its run, and its decision is in the graph
    lead = team.post(team.root, "/records/v1/annotations", {**decision, "reacts_to": [mine, sibling]})
    assert lead.status_code == 201, lead.text
    decisions = team.get(team.root, "/records/v1/annotations", kind="decision").json()["data"]
    assert {d["id"] for d in decisions} == {made.json()["id"], lead.json()["id"]}
