"""The records service through the real embedded gateway: experiments, annotations (typed,
validated, attributed), events, lineage, diff and the best accepted checkpoint.

Platform events are appended here with the platform's own EventLog and ExperimentRegistry
(what training and evaluation do in their transactions), so no model is trained."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from ops.builder import Gym
from services.records.events import (
    CHECKPOINT_REGISTERED,
    DATASET_REGISTERED,
    EVALUATION_JOB,
    TRAINING_JOB,
    EventLog,
)
from services.records.experiments import Experiment, ExperimentRegistry
from storage.store import Store
from tests.conftest import bearer, client_for, create_key

SHA_A, SHA_B = "a" * 64, "b" * 64


def events_of(gym: Gym) -> EventLog:
    ctx = gym.gateway.context
    return EventLog(ctx.store, ctx.internal_secret)


def platform_experiment(gym: Gym, run_id: str, owner: str, name: str, parents: list[str] | None = None) -> str:
    """An experiment as the platform makes one for an action (an implicit node)."""
    log = events_of(gym)
    with log.store.transaction() as s:
        return ExperimentRegistry(log).create(s, run_id=run_id, owner_key_id=owner, name=name,
                                              parents=parents or [], implicit=True).id


def set_status(gym: Gym, experiment_id: str, status: str) -> None:
    with gym.gateway.context.store.transaction() as s:
        s.execute(update(Experiment).where(Experiment.id == experiment_id).values(status=status))


def train(gym: Gym, run_id: str, key: str, exp: str, *, job: str, ckpt: str, parent: str | None,
          datasets: list[dict[str, str]], config_hash: str, score: float | None = None) -> None:
    """A finished training job with one checkpoint, and (``score``) a dev evaluation of it."""
    log = events_of(gym)
    log.record(run_id=run_id, kind=CHECKPOINT_REGISTERED, key_id=key, experiment_id=exp,
               data={"checkpoint_id": ckpt, "job_id": job, "base_model": "tiny", "parent_checkpoint": parent,
                     "weights_hash": f"w-{ckpt}", "dataset_hashes": [d["sha256"] for d in datasets],
                     "config_hash": config_hash, "step": 4})
    log.record(run_id=run_id, kind=TRAINING_JOB, key_id=key, experiment_id=exp,
               data={"job_id": job, "status": "succeeded", "base_model": "tiny", "input_checkpoint": parent,
                     "config_hash": config_hash, "datasets": datasets, "loss_module_hash": None,
                     "output_checkpoints": [ckpt], "steps": 4, "cost_nusd": 10})
    if score is not None:
        evaluate(gym, run_id, key, exp, job=f"ev-{job}", model=ckpt, score=score)


def evaluate(gym: Gym, run_id: str, key: str, exp: str, *, job: str, model: str, score: float,
             split: str = "dev", benchmark: str = "arith") -> None:
    events_of(gym).record(run_id=run_id, kind=EVALUATION_JOB, key_id=key, experiment_id=exp,
                          data={"job_id": job, "purpose": "agent", "status": "succeeded", "model": model,
                                "harness": "minimal", "benchmark": benchmark, "split": split, "attempts": 1,
                                "score": score})


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    return body


@pytest.fixture
def run(gym: Gym) -> Any:
    client = client_for(gym)
    root = create_key(client)
    yield client, root
    client.close()


def test_experiments_are_created_listed_and_read_with_their_events(gym: Gym, run: Any) -> None:
    client, root = run
    h = bearer(root["key"])
    first = client.post("/records/v1/experiments", json={"name": "baseline"}, headers=h)
    assert first.status_code == 201, first.text
    a = first.json()
    assert a["object"] == "experiment" and a["owner_key_id"] == root["id"] and a["status"] == "pending"
    assert a["implicit"] is False and a["parents"] == []
    second = client.post("/records/v1/experiments", json={"name": "lr sweep", "parents": [a["id"]],
                                                           "note": "halve the learning rate"}, headers=h)
    assert second.status_code == 201, second.text
    b = second.json()
    assert b["parents"] == [a["id"]]

    listed = client.get("/records/v1/experiments", headers=h).json()["data"]
    assert [x["id"] for x in listed] == [a["id"], b["id"]]
    got = client.get(f"/records/v1/experiments/{b['id']}", headers=h).json()
    assert [e["kind"] for e in got["events"]] == ["experiment.created"]
    assert got["events"][0]["data"]["parents"] == [a["id"]]
    assert [(n["kind"], n["note"]) for n in got["annotations"]] == [("note", "halve the learning rate")]

    assert_error(client.post("/records/v1/experiments", json={"name": "x", "parents": ["exp_nope"]}, headers=h),
                 404, "parents")
    assert_error(client.post("/records/v1/experiments", json={"name": ""}, headers=h), 422, "name")
    assert_error(client.post("/records/v1/experiments", json={"name": "x", "owner": "me"}, headers=h), 422, "owner")
    assert_error(client.get("/records/v1/experiments/exp_nope", headers=h), 404)
    assert len(client.get("/records/v1/experiments", headers=h).json()["data"]) == 2  # refusals wrote nothing


def test_annotations_are_typed_validated_and_attributed_to_the_writing_key(gym: Gym, run: Any) -> None:
    client, root = run
    minted = client.post("/v1/keys", json={"name": "worker"}, headers=bearer(root["key"]))
    assert minted.status_code == 201, minted.text
    worker = minted.json()
    h = bearer(worker["key"])
    exp = client.post("/records/v1/experiments", json={"name": "w"}, headers=h).json()["id"]

    hyp = client.post("/records/v1/annotations", json={"kind": "hypothesis", "statement": "more data helps"},
                      headers=h)
    assert hyp.status_code == 201, hyp.text
    assert hyp.json()["key_id"] == worker["id"] and hyp.json()["statement"] == "more data helps"
    finding = client.post("/records/v1/annotations", json={"kind": "finding", "claim": "dev +0.2",
                                                           "experiment_ids": [exp], "metric": "dev", "value": 0.2},
                          headers=h).json()
    assert finding["key_id"] == worker["id"] and finding["experiment_ids"] == [exp] and finding["value"] == 0.2
    review = client.post("/records/v1/annotations", headers=bearer(root["key"]), json={
        "kind": "review", "experiment_ids": [exp], "findings_supported": ["dev +0.2"],
        "uncertainties": ["one seed"], "suspected_protocol_violations": [], "regressions": [],
        "missing_comparisons": ["no base-model baseline"], "suggested_next_experiments": ["3 seeds"]})
    assert review.status_code == 201, review.text
    assert review.json()["key_id"] == root["id"] and review.json()["uncertainties"] == ["one seed"]

    bad = [
        ({"statement": "no kind"}, "kind"),
        ({"kind": "opinion", "text": "x"}, "kind"),
        ({"kind": "hypothesis"}, "statement"),
        ({"kind": "hypothesis", "statement": "x", "confidence": 0.9}, "confidence"),
        ({"kind": "finding", "claim": "x", "experiment_ids": []}, "experiment_ids"),
        ({"kind": "finding", "claim": "x"}, "experiment_ids"),
        ({"kind": "finding", "claim": "x", "experiment_ids": [exp], "value": "high"}, "value"),
        ({"kind": "review", "findings_supported": ["x"]}, "experiment_ids"),
        ({"kind": "review", "experiment_ids": [exp], "regressions": "none"}, "regressions"),
    ]
    for body, param in bad:
        assert_error(client.post("/records/v1/annotations", json=body, headers=h), 422, param)
    assert_error(client.post("/records/v1/annotations", headers=h,
                             json={"kind": "finding", "claim": "x", "experiment_ids": ["exp_nope"]}),
                 404, "experiment_ids")

    mine = client.get("/records/v1/annotations", headers=h).json()["data"]
    assert {(n["kind"], n["key_id"]) for n in mine} == {("hypothesis", worker["id"]), ("finding", worker["id"]),
                                                          ("review", root["id"])}
    reviews = client.get("/records/v1/annotations", params={"kind": "review", "experiment": exp}, headers=h)
    assert [n["id"] for n in reviews.json()["data"]] == [review.json()["id"]]


def test_lineage_diff_and_best_accepted_checkpoint_come_from_the_events(gym: Gym, run: Any) -> None:
    client, root = run
    run_id, key, h = root["id"], root["id"], bearer(root["key"])
    log = events_of(gym)
    log.record(run_id=run_id, kind=DATASET_REGISTERED, key_id=key,
               data={"dataset_id": "ds_a", "sha256": SHA_A, "rows": 10, "bytes": 100, "format": "jsonl", "name": "a"})
    e1 = platform_experiment(gym, run_id, key, "first")
    train(gym, run_id, key, e1, job="ftjob_1", ckpt="ckpt_1", parent=None,
          datasets=[{"id": "ds_a", "sha256": SHA_A}], config_hash="c1", score=0.4)
    e2 = platform_experiment(gym, run_id, key, "second", parents=[e1])
    train(gym, run_id, key, e2, job="ftjob_2", ckpt="ckpt_2", parent="ckpt_1",
          datasets=[{"id": "ds_b", "sha256": SHA_B}], config_hash="c2", score=0.6)
    e3 = platform_experiment(gym, run_id, key, "base eval")
    evaluate(gym, run_id, key, e3, job="ev-base", model="tiny", score=0.9)  # not a checkpoint: never "best"

    lineage = client.get("/records/v1/checkpoints/ckpt_2/lineage", headers=h).json()
    assert lineage["base_model"] == "tiny" and lineage["complete"] is True
    assert [(x["checkpoint"], x["job_id"], x["experiment_id"]) for x in lineage["links"]] == [
        ("ckpt_2", "ftjob_2", e2), ("ckpt_1", "ftjob_1", e1)]
    assert lineage["links"][0]["datasets"] == [{"id": "ds_b", "sha256": SHA_B}]
    assert lineage["links"][1]["config_hash"] == "c1" and lineage["links"][1]["weights_hash"] == "w-ckpt_1"
    assert_error(client.get("/records/v1/checkpoints/ckpt_nope/lineage", headers=h), 404)

    node = client.get(f"/records/v1/experiments/{e2}", headers=h).json()
    assert node["theta_in"] == {"model": "ckpt_1", "harness": "minimal"}
    assert node["theta_out"] == {"checkpoints": ["ckpt_2"]}
    assert [(x["kind"], x["job_id"]) for x in node["action"]] == [("training", "ftjob_2"), ("evaluation", "ev-ftjob_2")]
    assert node["evaluations"][0]["score"] == 0.6 and node["parents"] == [e1]

    diff = client.get(f"/records/v1/experiments/{e1}/diff/{e2}", headers=h).json()
    assert diff["config"]["a"] == ["c1"] and diff["config"]["b"] == ["c2"] and diff["config"]["same"] is False
    assert [d["sha256"] for d in diff["data"]["added"]] == [SHA_B]
    assert [d["sha256"] for d in diff["data"]["removed"]] == [SHA_A]
    assert diff["scores"] == [{"benchmark": "arith", "split": "dev", "a": 0.4, "b": 0.6, "delta": pytest.approx(0.2)}]

    # Nothing is audited yet: the best by dev score, marked unaudited; none accepted (404, the standard error).
    live = client.get("/records/v1/best-checkpoint", params={"benchmark": "arith"}, headers=h).json()
    assert (live["checkpoint"], live["score"], live["audit"]) == ("ckpt_2", 0.6, "unaudited")
    assert_error(client.get("/records/v1/best-checkpoint", params={"benchmark": "arith", "audited": "true"},
                            headers=h), 404)
    for exp in (e1, e3):
        set_status(gym, exp, "accepted")
    set_status(gym, e2, "flagged")  # the higher score is flagged: it does not count
    best = client.get("/records/v1/best-checkpoint", params={"benchmark": "arith", "split": "dev"}, headers=h)
    assert best.status_code == 200, best.text
    assert (best.json()["checkpoint"], best.json()["score"], best.json()["experiment_id"]) == ("ckpt_1", 0.4, e1)
    assert best.json()["audit"] == "accepted"
    set_status(gym, e2, "accepted")
    assert client.get("/records/v1/best-checkpoint", headers=h).json()["checkpoint"] == "ckpt_2"
    assert_error(client.get("/records/v1/best-checkpoint", params={"split": "official"}, headers=h), 404)


def test_events_page_by_sequence_and_the_chain_verifies(gym: Gym, run: Any) -> None:
    client, root = run
    h = bearer(root["key"])
    for i in range(5):
        client.post("/records/v1/experiments", json={"name": f"e{i}"}, headers=h)
    page = client.get("/records/v1/events", params={"limit": 2}, headers=h).json()
    assert [e["seq"] for e in page["data"]] == [1, 2] and page["has_more"] is True and page["next_after"] == 2
    rest = client.get("/records/v1/events", params={"after": 2, "kind": "experiment.created"}, headers=h).json()
    assert [e["seq"] for e in rest["data"]] == [3, 4, 5] and rest["has_more"] is False
    assert all(e["key_id"] == root["id"] for e in rest["data"])
    assert rest["data"][0]["prev_hash"] == page["data"][1]["hash"]
    assert_error(client.get("/records/v1/events", params={"kind": "made.up"}, headers=h), 422, "kind")
    assert_error(client.get("/records/v1/events", params={"after": "x"}, headers=h), 422, "after")
    chain = client.get("/records/v1/chain", headers=h).json()
    assert chain["ok"] is True and chain["events"] == 5 and chain["head_seq"] == 5


def test_records_on_both_stores(make_gym: Any, store: Store) -> None:
    """The scoped reads and writes on SQLite and PostgreSQL alike."""
    gym = make_gym(store=store)
    with client_for(gym) as client:
        root = create_key(client)
        worker = client.post("/v1/keys", json={"name": "w"}, headers=bearer(root["key"])).json()
        mine = client.post("/records/v1/experiments", json={"name": "root's"}, headers=bearer(root["key"])).json()
        theirs = client.post("/records/v1/experiments", json={"name": "worker's"},
                             headers=bearer(worker["key"])).json()
        assert [x["id"] for x in client.get("/records/v1/experiments", headers=bearer(worker["key"])).json()["data"]] \
            == [theirs["id"]]
        assert client.get(f"/records/v1/experiments/{mine['id']}", headers=bearer(worker["key"])).status_code == 404
        assert len(client.get("/records/v1/experiments", headers=bearer(root["key"])).json()["data"]) == 2
        assert client.get("/records/v1/chain", headers=bearer(root["key"])).json()["ok"] is True


def test_sdk_and_agent_cli_speak_to_the_records_service(gym: Gym, run: Any, tmp_path: Any,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import rsigym
    from rsigym.cli import main

    client, root = run

    def sdk() -> rsigym.Gym:
        return rsigym.Gym(base_url="http://gym", api_key=root["key"], http_client=client_for(gym))

    with sdk() as g:
        a = g.records.experiments.create("baseline")
        b = g.records.experiments.create("next", parents=[a.id], note="try more data")
        assert [x.id for x in g.records.experiments.list()] == [a.id, b.id]
        assert g.records.experiments.get(b.id).parents == [a.id]
        assert g.records.experiments.diff(a.id, b.id).scores == []
        finding = g.records.annotations.finding("b beats a", experiment_ids=[b.id], metric="dev", value=0.1)
        assert finding.key_id == root["id"] and finding.claim == "b beats a"  # type: ignore[attr-defined]
        g.records.annotations.review([a.id, b.id], uncertainties=["one seed"])
        assert {n.kind for n in g.records.annotations.list()} == {"note", "finding", "review"}
        assert [e.kind for e in g.records.events(kind="experiment.created")] == ["experiment.created"] * 2
        assert g.records.chain().ok
        with pytest.raises(rsigym.NotFoundError):
            g.records.best_checkpoint(benchmark="arith")
        with pytest.raises(rsigym.UnprocessableEntityError):
            g.records.annotations.create({"kind": "finding", "claim": "no evidence", "experiment_ids": []})

    assert main(["records", "new", "cli experiment", "--parent", b.id], client_factory=sdk) == 0
    new_id = capsys.readouterr().out.strip()
    assert new_id.startswith("exp_")
    assert main(["records", "experiments", "--json"], client_factory=sdk) == 0
    assert [x["id"] for x in json.loads(capsys.readouterr().out)] == [a.id, b.id, new_id]
    body = tmp_path / "h.json"
    body.write_text(json.dumps({"statement": "lr matters", "experiment_ids": [new_id]}))
    assert main(["records", "annotate", "hypothesis", "--json", str(body)], client_factory=sdk) == 0
    assert capsys.readouterr().out.strip().startswith("ann_")
    body.write_text(json.dumps({"claim": "x", "experiment_ids": []}))
    assert main(["records", "annotate", "finding", "--json", str(body)], client_factory=sdk) == 1
    assert "invalid_request_error" in capsys.readouterr().err
    assert main(["records", "chain"], client_factory=sdk) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    assert main(["records", "diff", a.id, new_id], client_factory=sdk) == 0
    assert main(["records", "best"], client_factory=sdk) == 1
