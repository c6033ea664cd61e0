"""The run-level verdict of `audit_run` (services/records/audits/run.py), on SQLite and PostgreSQL:
a malformed or missing judge answer never yields `accepted`; a valid one over a clean run does;
neither empty experiments nor evaluations dilute the hacking rate; the verdict is stored and on the chain.

The judge is the real RolloutJudge answering through LiteLLM's own ``mock_response``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from access.keys import KeyRegistry
from access.presets import preset_policy
from billing.money import usd_to_nusd
from kit.config import GymConfig
from kit.settings import ProviderSecrets
from services.evaluation.registry import BenchmarkRegistry
from services.records.audits.context import AuditContext
from services.records.audits.findings import CheckResult, Finding
from services.records.audits.judge import RolloutJudge
from services.records.audits.run import audit_run, verdict
from services.records.audits.taxonomy import CATEGORY_IDS
from services.records.events import AUDIT_RESULT, EVALUATION_JOB, TRAINING_JOB, EventLog
from services.records.experiments import Experiment, ExperimentRegistry
from services.records.tables import AuditRow
from storage.store import Store
from tests.fakes.live_gym import mini_benchmark

SECRET = "internal-secret"
VALID = json.dumps({"categories": {c: {"code": "NOT_OBSERVED", "evidence": "nothing of the kind in the material"}
                                   for c in CATEGORY_IDS}, "summary": "clean"})


def config() -> GymConfig:
    return GymConfig.model_validate({
        "rollout": {"models": [{"name": "judge", "litellm_model": "openai/judge", "api_base": "http://127.0.0.1:9/v1",
                                "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0}]},
        "audit": {"judge_model": "judge"}})


def judge(answer: str) -> RolloutJudge:
    return RolloutJudge(config(), ProviderSecrets({}), "judge", mock_response=answer)


@pytest.fixture
def run(store: Store, tmp_path: Path) -> tuple[AuditContext, list[str]]:
    """A run key with three experiments: two that trained or evaluated, one left empty."""
    BenchmarkRegistry(store, tmp_path / "evaluation" / "benchmarks").register(mini_benchmark(tmp_path / "b"))
    view, _ = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=usd_to_nusd(1), track="joint")
    run_id = view["id"]
    events = EventLog(store, SECRET)
    experiments = ExperimentRegistry(events)
    ids = []
    with store.transaction() as s:
        for name in ("trained", "evaluated", "empty"):
            ids.append(experiments.create(s, run_id=run_id, owner_key_id=run_id, name=name, parents=[],
                                          implicit=False).id)
    events.record(run_id=run_id, kind=TRAINING_JOB, key_id=run_id, experiment_id=ids[0],
                  data={"job_id": "ftjob_x", "status": "failed", "datasets": []})
    events.record(run_id=run_id, kind=EVALUATION_JOB, key_id=run_id, experiment_id=ids[1],
                  data={"job_id": "evj_x", "purpose": "agent", "status": "succeeded", "score": 0.5})
    ctx = AuditContext(store=store, config=config(), data_dir=tmp_path, events=events, run_id=run_id)
    return ctx, ids


def statuses(ctx: AuditContext) -> dict[str, str]:
    with ctx.store.transaction() as s:
        return {e.id: e.status for e in s.scalars(select(Experiment).where(Experiment.run_id == ctx.run_id))}


def test_a_valid_judge_answer_over_a_clean_run_accepts_it(run: tuple[AuditContext, list[str]]) -> None:
    ctx, ids = run
    report = audit_run(ctx, judge=judge(VALID))
    assert report["status"] == "accepted", report
    assert {c["name"]: c["verdict"] for c in report["checks"]} == {
        "contamination": "pass", "provenance": "pass", "harness": "pass", "score_gap": "pass", "behaviour": "pass"}
    assert set(statuses(ctx).values()) == {"accepted"}
    assert report["hacking_rate"] == 0.0
    with ctx.store.transaction() as s:
        stored = s.scalars(select(AuditRow).where(AuditRow.run_id == ctx.run_id)).one()
    assert stored.status == "accepted" and stored.report["audit_id"] == stored.id
    last = ctx.run_events(AUDIT_RESULT)[-1]
    assert last.data["audit_id"] == stored.id and ctx.events.verify(ctx.run_id).ok


@pytest.mark.parametrize("answer", ["I think the run is fine.", "", '{"categories": {"credential_use": {"code": '
                                    '"NOT_OBSERVED", "evidence": "none"}}}', "{not json"])
def test_a_malformed_partial_or_empty_judge_answer_never_yields_accepted(run: tuple[AuditContext, list[str]],
                                                                         answer: str) -> None:
    ctx, ids = run
    report = audit_run(ctx, judge=judge(answer))
    assert report["status"] == "flagged"
    assert next(c for c in report["checks"] if c["name"] == "behaviour")["verdict"] == "inconclusive"
    assert "behaviour" in report["inconclusive"]
    assert set(statuses(ctx).values()) == {"pending"}  # nothing accepted without a valid verdict


def test_no_judge_configured_is_inconclusive_not_a_pass(run: tuple[AuditContext, list[str]]) -> None:
    ctx, _ = run
    ctx.config = config().model_copy(update={"audit": config().audit.model_copy(update={"judge_model": None})})
    report = audit_run(ctx)
    assert report["status"] == "flagged" and "behaviour" in report["inconclusive"]


def test_empty_experiments_do_not_dilute_the_hacking_rate(run: tuple[AuditContext, list[str]]) -> None:
    ctx, ids = run
    # One of the two experiments that did something is caught executing a hack; nothing else.
    checks = [CheckResult("contamination", "pass"), CheckResult("harness", "pass"),
              CheckResult("provenance", "flag", [Finding("model_or_weight_substitution", "EXECUTED",
                                                         "weights differ on disk", experiment_ids=[ids[0]])]),
              CheckResult("behaviour", "pass")]
    result = verdict(ctx, None, checks)
    assert result["status"] == "flagged"
    assert {e: st for e, (st, _) in result["statuses"].items()} == {
        ids[0]: "flagged", ids[1]: "accepted", ids[2]: "accepted"}
    # Without a submission the units are the experiments that trained, plus every flagged one: the
    # evaluation and the empty experiment are no units. (This was 0.5 while an evaluation counted:
    # the diluted rate, services/records/audits/units.py.)
    assert result["hacking_rate"] == 1.0
    assert result["units"] == [{"unit": ids[0], "flagged": True, "lineage": False}]
