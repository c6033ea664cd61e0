"""``--from RUN`` at key creation (access/generations.py, services/records/read.py accepted_system): a run starts
from an earlier run's scored, audit-accepted final submission, one generation on; anything less is
refused with the standard error and mints no key.

The earlier runs' submissions, scores and audits are written as the services write them (their
rows, on the real store): this file is about the refusals and the generation row; the full loop
(train, submit, score, audit, start from it, serve, train, audit across runs) is
tests/e2e/test_generations_from.py."""

from __future__ import annotations

from typing import Any

import pytest

from access.generations import chain, generation_of
from kit.ids import new_id
from ops.tasks import find_task, render_instruction
from services.evaluation.tables import ScoreRow, SubmissionRow
from services.records.tables import AuditRow
from storage.tables import ApiKey
from tests.conftest import admin_headers, client_for, create_key


@pytest.fixture
def admin(gym: Any) -> Any:
    with client_for(gym) as client:
        yield client


def _keys(gym: Any) -> int:
    with gym.gateway.store.transaction() as s:
        return s.query(ApiKey).count()


def _end(admin: Any, run_id: str) -> None:
    r = admin.post(f"/admin/v1/keys/{run_id}/end", json={"reason": "finished", "agent_exit": 0},
                   headers=admin_headers())
    assert r.status_code == 200, r.text


def _submit(gym: Any, run_id: str, *, model: str = "tiny", harness: str = "minimal") -> str:
    sub = new_id("sub")
    with gym.gateway.store.transaction() as s:
        s.add(SubmissionRow(id=sub, run_id=run_id, key_id=run_id, track="joint", checkpoint_id=None, model=model,
                            harness=harness))
    return sub


def _audit(gym: Any, run_id: str, submission: str, status: str, flagged: tuple[str, ...] = ()) -> str:
    audit = new_id("aud")
    checks = [{"name": n, "verdict": "flag"} for n in flagged] + [{"name": "provenance", "verdict": "pass"}]
    with gym.gateway.store.transaction() as s:
        s.add(AuditRow(id=audit, run_id=run_id, status=status, hacking_rate=0.0,
                       report={"submission": {"id": submission}, "checks": checks, "submission_reasons": []}))
    return audit


def _score(gym: Any, run_id: str, submission: str, status: str = "succeeded") -> None:
    with gym.gateway.store.transaction() as s:
        s.add(ScoreRow(id=new_id("score"), run_id=run_id, submission_id=submission, benchmark="arithmetic",
                       split="official", model="tiny", harness="minimal", attempts=1, job_id=new_id("evjob"),
                       score=0.5, status=status))


def _from(admin: Any, run_id: str) -> Any:
    return admin.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1.0,
                                              "run": {"task": "t", "agent": "a", "from_run": run_id}},
                      headers=admin_headers())


def _refused(admin: Any, gym: Any, run_id: str, status: int, words: str) -> dict[str, Any]:
    before = _keys(gym)
    r = _from(admin, run_id)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["param"] == "from_run"
    assert words in body["error"]["message"], body
    assert _keys(gym) == before  # a refused --from mints no key
    return body


def test_from_is_refused_until_the_run_is_ended_audited_accepted_and_scored(admin: Any, gym: Any) -> None:
    _refused(admin, gym, "key_doesnotexist", 404, "not found")
    gen1 = create_key(admin, track="joint")["id"]
    _refused(admin, gym, gen1, 409, "has not ended")
    _end(admin, gen1)
    _refused(admin, gym, gen1, 409, "submitted nothing")
    sub = _submit(gym, gen1)
    _refused(admin, gym, gen1, 409, "has not been audited")
    flagged = _audit(gym, gen1, sub, "flagged", flagged=("contamination",))
    body = _refused(admin, gym, gen1, 409, f"run {gen1}'s audit flagged it: contamination")
    assert flagged in body["error"]["message"]
    _audit(gym, gen1, sub, "accepted")
    _refused(admin, gym, gen1, 409, "has not been scored")
    _score(gym, gen1, sub, status="failed")
    _refused(admin, gym, gen1, 409, "has not been scored")
    _score(gym, gen1, sub)

    gen2 = _from(admin, gen1)
    assert gen2.status_code == 201, gen2.text
    view = gen2.json()
    assert view["generation"] == 2 and view["from_run"] == gen1 and view["chain_root"] == gen1
    assert view["initial_system"] == {"model": "tiny", "harness": "minimal", "weights_hash": None,
                                      "base_model": "tiny", "submission": sub}
    shown = admin.get(f"/admin/v1/keys/{view['id']}", headers=admin_headers()).json()
    assert shown["generation"] == 2 and shown["initial_system"]["model"] == "tiny"
    listed = {k["id"]: k for k in admin.get("/admin/v1/keys", headers=admin_headers()).json()["data"]}
    assert listed[gen1]["generation"] == 1 and listed[gen1]["from_run"] is None
    assert listed[view["id"]]["generation"] == 2


def test_a_later_audit_that_flags_the_submission_refuses_again(admin: Any, gym: Any) -> None:
    gen1 = create_key(admin, track="joint")["id"]
    _end(admin, gen1)
    sub = _submit(gym, gen1)
    _audit(gym, gen1, sub, "accepted")
    _score(gym, gen1, sub)
    _audit(gym, gen1, sub, "flagged", flagged=("score_gap",))  # `rsigym score --wait` audits again after scoring
    _refused(admin, gym, gen1, 409, "audit flagged it: score_gap")


def test_generations_chain_to_the_first_run(admin: Any, gym: Any) -> None:
    def accepted(run_id: str) -> None:
        _end(admin, run_id)
        sub = _submit(gym, run_id)
        _audit(gym, run_id, sub, "accepted")
        _score(gym, run_id, sub)

    gen1 = create_key(admin, track="joint")["id"]
    accepted(gen1)
    gen2 = _from(admin, gen1).json()["id"]
    accepted(gen2)
    gen3 = _from(admin, gen2).json()
    assert gen3["generation"] == 3 and gen3["from_run"] == gen2 and gen3["chain_root"] == gen1
    with gym.gateway.store.transaction() as s:
        assert [(link.run_id, link.generation) for link in chain(s, gen3["id"])] == [(gen1, 1), (gen2, 2),
                                                                                       (gen3["id"], 3)]
        assert generation_of(s, gen1) == 1 and generation_of(s, gen3["id"]) == 3
    _refused(admin, gym, gen3["id"], 409, "has not ended")


def test_the_instruction_names_the_initial_system_and_fixes_training_to_it(gym: Any) -> None:
    task = find_task("data-arithmetic")
    plain = render_instruction(task, gym.gateway.config)
    assert "Initial system" not in plain and "`parent_checkpoint` = `null`" in plain
    minted = {"generation": 2, "from_run": "key_gen1", "initial_system": {
        "model": "ckpt_abc", "harness": "minimal", "weights_hash": "f" * 64, "base_model": "tiny",
        "submission": "sub_1"}}
    text = render_instruction(task, gym.gateway.config, minted)
    assert "## Initial system (generation 2)" in text
    assert "run `key_gen1`" in text and "Checkpoint `ckpt_abc`" in text and "Harness `minimal`" in text
    assert '`parent_checkpoint` = `"ckpt_abc"`' in text  # the data track trains from the initial checkpoint only

