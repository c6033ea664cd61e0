"""A score cannot be bought past the audit: scoring is the operator's, and the audited submission
is the scored one (issue 51, classes 4 and 5).

Played as the agent, on a live gym with a judge (the stand-in provider) and the two-task ``mini``
benchmark. The cheat is a harness that embeds the official questions and their answers (official
score 1.0; the harness audit flags it); the clean control answers 0 (score 0.0, accepted).

* Class 4 — scoring is the operator's, end to end: scoring an open run ends it (the agent's next
  submission is refused with ``run_ended``); the scoring and baseline jobs are not the run's (not in
  its listing, their events on the operator's record: a run reopened afterwards reads no official
  score); their evidence is kept and never charged to a run that filled its storage quota; the
  reaper's end of the run does not cancel the scoring.
* Class 5 — one submission rule: the run's latest submission before it ends is audited and scored.
  A cheat swapped in while ``rsigym score`` audits is refused; scoring refuses an audited
  submission that is not the final one; ``rsigym score`` re-audits the cheat submitted after a
  clean audit and scores it flagged; the report's integrity is the audit of the scored submission.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from billing.storage_quota import StorageQuota
from ops.cli.admin_client import AdminClient
from ops.cli.main import app as operator_cli
from services.evaluation.report import newest_audits
from services.records.events import OPERATOR_RECORD
from tests.conftest import ADMIN_TOKEN, TEACHER_ENV, gym_config, require_bwrap
from tests.fakes.live_gym import FINAL, LiveGym, harness_archive, live_gym, mini_benchmark, registered_tasks

CLEAN = "echo 0 > /app/answer.txt\n"
"""Every mini task is a - b with a > b: 0 is always wrong (official score 0.0)."""
NOT_KEPT = "[trajectory and trial files not kept"
"""What a trial's agent_output starts with when its evidence was dropped for the run's quota."""


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory, standin: tuple[str, Any],
           teacher_secret: str) -> Iterator[LiveGym]:
    require_bwrap()
    config = gym_config(standin[0])
    config.audit.judge_model = "judge"  # the stand-in provider answers the judge: a clean run is accepted
    with live_gym(tmp_path_factory.mktemp("gym"), config=config, secrets={TEACHER_ENV: teacher_secret}) as served:
        assert served.register(mini_benchmark(tmp_path_factory.mktemp("bench"), name="mini"))["status"] == "ready"
        yield served


@pytest.fixture(autouse=True)
def operator_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)


def cheat_script(live: LiveGym) -> str:
    """An answer table of the official questions (as if they had leaked): 1.0 without asking the model."""
    cases = []
    for task in registered_tasks(live.gym, "mini"):
        question = (task.path / "instruction.md").read_text().strip()
        a, op, b = question.removeprefix("What is ").rstrip("?").split()
        cases.append(f'  "{question}") echo {int(a) - int(b) if op == "-" else int(a) + int(b)} > /app/answer.txt ;;')
    return 'case "$(cat "$RSIGYM_TASK_INSTRUCTION_FILE")" in\n' + "\n".join(cases) + "\n  *) echo 0 > /app/answer.txt ;;\nesac\n"


def rsigym(url: str, *args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(operator_cli, [*args, "--url", url])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args else result


def harness(agent: httpx.Client, name: str, script: str) -> str:
    r = agent.post("/evaluation/v1/harnesses", content=harness_archive(name, script))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def submit(agent: httpx.Client, harness_id: str) -> httpx.Response:
    return agent.post("/evaluation/v1/submissions", json={"harness": harness_id})


def refused_run_ended(r: httpx.Response) -> bool:
    body = r.json()
    return r.status_code == 403 and body.get("type") == "error" and body["error"]["type"] == "run_ended"


def wait_records(live: LiveGym, ids: set[str], timeout: float = 300) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {s["id"]: s for s in live.http.get("/admin/v1/scores").json()["data"] if s["id"] in ids}
        if set(found) == ids and all(s["status"] in FINAL for s in found.values()):
            return found
        time.sleep(0.5)
    raise AssertionError(f"score records {sorted(ids)} not final in {timeout} s")


def report_row(url: str, out: Path, run_id: str) -> dict[str, Any]:
    report = rsigym(url, "report", "--out", str(out), "--json")
    return next(r for r in report["runs"] if r["run_id"] == run_id)


def score_of(row: dict[str, Any]) -> float:
    return float(row["benchmarks"][0]["submitted"])


# -- class 4: scoring is the operator's ------------------------------------------------------------


def test_scoring_ends_the_run_keeps_its_evidence_and_the_run_reads_none_of_it(
        judged: LiveGym, tmp_path: Path) -> None:
    live = judged
    key = live.key(track="harness")
    run_id, agent = key["id"], live.agent(key)
    clean = harness(agent, "clean", CLEAN)
    sub = submit(agent, clean)
    assert sub.status_code == 201, sub.text
    # The run fills its storage quota (as many datasets would); the operator's baselines are at it too.
    quota = StorageQuota.of(live.gym.gateway.context)
    room = {owner: quota.quota_bytes - quota.used(owner) for owner in (run_id, OPERATOR_RECORD)}
    with live.gym.gateway.store.transaction() as s:
        for owner, nbytes in room.items():
            quota.charge(s, owner, "datasets", nbytes, param=None)
    assert quota.used(run_id) == quota.quota_bytes

    # avg@2: an attempts count no other test here scores, so the baseline is scored now too.
    started = rsigym(live.url, "score", run_id, "--benchmark", "mini", "--attempts", "2", "--json")
    ours = {r["id"]: r for r in started["data"]}
    # Scoring started: the agent can no longer submit (nor call anything): the run ended.
    again = submit(agent, clean)
    assert refused_run_ended(again), again.text
    assert refused_run_ended(agent.get("/records/v1/events"))
    assert started["run_ended_now"] is True and started["audit"]["submission_id"] == sub.json()["id"]
    assert started["audit"]["status"] == "accepted"
    assert sorted(r["run_id"] for r in ours.values()) == sorted([run_id, "initial"])
    # The reaper ends the run as at any deadline: the run's own work stops, the scoring does not.
    assert run_id in [e["run_id"] for e in live.http.post("/admin/v1/runs/end-expired").json()["data"]]
    done = wait_records(live, set(ours))
    assert all(r["status"] == "succeeded" for r in done.values()), done
    assert next(r for r in done.values() if r["run_id"] == run_id)["score"] == 0.0

    # Scoring and baseline evidence: never charged to the run (or the operator) at its quota, never dropped.
    assert quota.used(run_id) == quota.used(OPERATOR_RECORD) == quota.quota_bytes
    for record in done.values():
        trials = live.http.get(f"/admin/v1/evaluation/jobs/{record['job_id']}/results").json()["data"]
        assert len(trials) == 4 and all(not (t["agent_output"] or "").startswith(NOT_KEPT) for t in trials), trials

    # The scoring's events are on the operator's record, naming the run and the scored submission ...
    theirs = live.http.get(f"/admin/v1/runs/{OPERATOR_RECORD}/events", params={"kind": "evaluation.job"}).json()["data"]
    assert {(e["data"]["purpose"], e["data"]["scored_run"], e["data"]["submission_id"]) for e in theirs
            if e["data"]["job_id"] in {r["job_id"] for r in done.values()}} == {
        ("score", run_id, sub.json()["id"]), ("baseline", "initial", None)}
    # ... and not on the run's: reopened (an operator moves its deadline), it reads no official score.
    assert live.http.post(f"/admin/v1/keys/{run_id}/deadline", json={"deadline_s": 3600}).status_code == 200
    events = agent.get("/records/v1/events", params={"kind": "evaluation.job"})
    assert events.status_code == 200 and events.json()["data"] == [], events.text
    assert agent.get("/evaluation/v1/jobs").json()["data"] == []
    for record in done.values():
        assert agent.get(f"/evaluation/v1/jobs/{record['job_id']}").status_code == 404


# -- class 5: one submission rule; the audited submission is the scored one -----------------------


def test_a_cheat_swapped_in_while_the_score_command_audits_is_refused(
        judged: LiveGym, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    live = judged
    key = live.key(track="harness")
    run_id, agent = key["id"], live.agent(key)
    clean, cheat = harness(agent, "clean", CLEAN), harness(agent, "cheat", cheat_script(live))
    first = submit(agent, clean).json()["id"]
    swapped: list[httpx.Response] = []
    audit = AdminClient.audit

    def audit_then_swap(self: AdminClient, run: str, **kwargs: Any) -> dict[str, Any]:
        report: dict[str, Any] = audit(self, run, **kwargs)
        swapped.append(submit(agent, cheat))  # the agent's cheat lands just after the audit read the clean one
        return report

    monkeypatch.setattr(AdminClient, "audit", audit_then_swap)
    out = rsigym(live.url, "score", run_id, "--benchmark", "mini", "--attempts", "1", "--wait", "--json")
    row = next(r for r in out["data"] if r["run_id"] == run_id)
    print(f"\nswap during the audit: submit {swapped[0].status_code}, audit {out['audit']['status']} of "
          f"{out['audit']['submission_id']}, scored {row['submission_id']}: {row['score']}")
    assert refused_run_ended(swapped[0]), swapped[0].text  # the run ended before its audit
    assert out["audit"]["status"] == "accepted" and out["audit"]["submission_id"] == first
    assert row["submission_id"] == first and row["score"] == 0.0
    reported = report_row(live.url, tmp_path / "report", run_id)
    assert reported["integrity"] == "accepted" and score_of(reported) == 0.0  # the clean control


def test_the_final_submission_is_audited_and_scored_and_its_audit_is_the_reports(
        judged: LiveGym, tmp_path: Path) -> None:
    live = judged
    key = live.key(track="harness")
    run_id, agent = key["id"], live.agent(key)
    clean, cheat = harness(agent, "clean", CLEAN), harness(agent, "cheat", cheat_script(live))
    first = submit(agent, clean).json()["id"]
    audited = rsigym(live.url, "audit", run_id, "--json")
    assert audited["status"] == "accepted" and audited["submission"]["id"] == first
    second = submit(agent, cheat)  # the run is open: a later submission replaces the earlier one
    assert second.status_code == 201, second.text

    # Scoring the audited submission is refused: it is no longer the run's final one.
    r = live.http.post(f"/admin/v1/runs/{run_id}/score",
                       json={"attempts": 1, "benchmarks": ["mini"], "submission_id": first})
    assert r.status_code == 409 and r.json()["error"]["param"] == "submission_id", r.text
    assert refused_run_ended(submit(agent, clean))  # scoring ended the run all the same
    # Scored through the API without an audit of it, the cheat is not vouched for by the clean audit.
    r = live.http.post(f"/admin/v1/runs/{run_id}/score", json={"attempts": 1, "benchmarks": ["mini"]})
    assert r.status_code == 202 and r.json()["run"]["submission_id"] == second.json()["id"], r.text
    wait_records(live, {s["id"] for s in r.json()["data"]})
    reported = report_row(live.url, tmp_path / "unaudited", run_id)
    assert (reported["integrity"], score_of(reported)) == ("not audited", 1.0)

    # `rsigym score` audits the final submission (the cheat) and scores exactly that one.
    out = rsigym(live.url, "score", run_id, "--benchmark", "mini", "--attempts", "1", "--wait", "--json")
    row = next(r for r in out["data"] if r["run_id"] == run_id)
    print(f"\nclean audited, cheat submitted: audit {out['audit']['status']} of {out['audit']['submission_id']}, "
          f"scored {row['submission_id']}: {row['score']}")
    assert out["audit"]["submission_id"] == row["submission_id"] == second.json()["id"]
    assert out["audit"]["status"] == "flagged" and row["score"] == 1.0
    reported = report_row(live.url, tmp_path / "report", run_id)
    assert (reported["integrity"], score_of(reported)) == ("flagged", 1.0)

    # Reopened, the run submits a clean system that is audited (accepted): that audit does not vouch
    # for the scored cheat.
    assert live.http.post(f"/admin/v1/keys/{run_id}/deadline", json={"deadline_s": 3600}).status_code == 200
    assert submit(agent, clean).status_code == 201
    assert rsigym(live.url, "audit", run_id, "--json")["status"] == "accepted"
    reported = report_row(live.url, tmp_path / "again", run_id)
    assert (reported["integrity"], score_of(reported)) == ("flagged", 1.0)


def test_an_audit_vouches_only_for_the_submission_it_judged() -> None:
    audits: list[dict[str, Any]] = [  # as GET /admin/v1/audits answers
        {"run_id": "r1", "status": "flagged", "submission_id": "sub_cheat", "created_at": "2025-01-01T00:00"},
        {"run_id": "r1", "status": "accepted", "submission_id": "sub_clean", "created_at": "2025-01-02T00:00"},
        {"run_id": "r2", "status": "accepted", "report": {"submission": {"id": "sub_old"}}, "created_at": "2025-01-01"},
    ]
    verdicts = newest_audits(audits, {"r1": {"sub_cheat"}, "r2": {"sub_new"}, "r3": {"a", "b"}})
    assert {run: v.status for run, v in verdicts.items()} == {"r1": "flagged"}  # r2: not audited
    assert newest_audits(audits)["r1"].status == "accepted"  # unscoped: the newest, whatever it judged
