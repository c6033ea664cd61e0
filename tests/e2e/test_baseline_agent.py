"""The scripted baseline research agent (agent_container/agents/baseline.py), launched as an
operator launches it (``rsigym run start --task T --agent baseline``) against an embedded gym with
the tiny model, the stand-in teacher and a small arithmetic benchmark: the same agent on the
harness track touches neither training nor rollout and submits only a harness; on the joint track
it generates teacher data, trains, evaluates the checkpoint and harness variants, records its
hypotheses and findings, and submits the best accepted dev system.

Both runs go at once against one gym (a module fixture); the tests read what each left behind."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kit.settings import GymSettings, ProviderSecrets
from ops.builder import build_embedded
from ops.cli.main import app as operator_cli
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, TEACHER_ENV, admin_headers, gym_config, require_bwrap
from tests.e2e.test_launcher import report
from tests.fakes.live_gym import BENCHMARKS, mini_benchmark
from tests.fakes.servers import serve_gym

OFFLINE_CONFIG = Path(__file__).resolve().parents[2] / "kit" / "offline_gym.toml"
AGENT_ARGS = ["--limit", "2", "--rows", "24", "--steps", "4", "--votes", "2", "--poll", "0.5"]
"""Small: two dev tasks per evaluation, 24 teacher rows, 4 training steps, 2 votes."""
TRACKS = {"harness": "harness-arithmetic", "joint": "joint-arithmetic"}


def _rsigym(*args: str) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, standin: tuple[str, Any], teacher_secret: str) -> Iterator[dict[str, Any]]:
    """Launch the baseline agent on the harness and joint tracks at once; wait for both to exit."""
    require_bwrap()
    root = tmp_path_factory.mktemp("baseline")
    bench = mini_benchmark(root / "bench", name="arithmetic", per_split=2)  # the tasks' benchmark, 2 tasks a split
    data_dir = root / "runs"
    data_dir.mkdir()
    settings = GymSettings(data_dir=root / "gym", admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR)
    gym = build_embedded(settings, config=gym_config(standin[0]), run_reaper=False,
                         provider_secrets=ProviderSecrets({TEACHER_ENV: teacher_secret}))
    with serve_gym(gym) as url, pytest.MonkeyPatch.context() as mp, httpx.Client(
            base_url=url, headers=admin_headers(), timeout=60) as admin:
        # The CLI renders a task's policy from its own config: the gym's, whose harness model the
        # tests keep tiny (tests/conftest.py tiny_instruct), not the default's SmolLM2.
        cli_config = root / "cli.toml"
        cli_config.write_text(OFFLINE_CONFIG.read_text() + '\n[tracks]\ninstruct_model = "tiny"\n')
        for name, value in {"RSIGYM_URL": url, "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN, "RSIGYM_DATA_DIR": str(data_dir),
                            "RSIGYM_CONFIG": str(cli_config)}.items():
            mp.setenv(name, value)
        assert admin.post("/admin/v1/benchmarks", json={"path": str(bench)}).status_code == 201
        for _ in range(600):  # validated: every oracle 1, every empty answer 0
            status = {b["name"]: b for b in admin.get("/admin/v1/benchmarks").json()["data"]}["arithmetic"]["status"]
            if status != "validating":
                break
            time.sleep(0.5)
        assert status == "ready", status
        started = {track: _rsigym("run", "start", "--task", task, "--agent", "baseline", "--json", "--", *AGENT_ARGS)
                   for track, task in TRACKS.items()}
        for _ in range(2400):
            shown = {t: _rsigym("run", "show", s["run"], "--json") for t, s in started.items()}
            if all(s["status"] != "running" for s in shown.values()):
                break
            time.sleep(0.5)
        out = {}
        for track, s in started.items():
            run = s["run"]
            log = _rsigym("run", "logs", run)
            out[track] = {"run": run, "shown": shown[track], "log": log, "seen": report(log), "gym_dir": root / "gym",
                          "ledger": admin.get(f"/admin/v1/keys/{run}/ledger").json()["data"],
                          "events": admin.get(f"/admin/v1/runs/{run}/events", params={"limit": 1000}).json()["data"],
                          "experiments": admin.get(f"/admin/v1/runs/{run}/experiments").json()["data"],
                          "results": {e["job"]: admin.get(f"/admin/v1/evaluation/jobs/{e['job']}/results").json()["data"]
                                      for e in _lines(log, "evaluation")}}
        yield out
    for name in ("evaluation", "training"):
        getattr(gym.service_apps[name].state, name).runner.shutdown()


def _lines(log: str, name: str) -> list[Any]:
    """Every ``name: json`` line of the agent's log (``report`` keeps only the last)."""
    return [json.loads(line.partition(": ")[2]) for line in log.splitlines() if line.startswith(f"{name}: ")]


def test_on_the_harness_track_it_never_trains_or_rolls_out_and_submits_only_a_harness(runs: dict[str, Any]) -> None:
    r = runs["harness"]
    assert r["shown"]["status"] == "exited" and r["shown"]["exit_code"] == 0, r["log"]
    assert r["seen"]["rules"]["track"] == "harness" and r["seen"]["rules"]["needs"] == ["harness"]
    # The ledger holds no training or rollout row, and no call to either was even refused: it read the track.
    services = {row["service"] for row in r["ledger"]}
    assert services and not services & {"training", "rollout"}, services
    refused = [e["data"] for e in r["events"] if e["kind"] == "call.refused"]
    assert refused == [], refused
    kinds = {e["kind"] for e in r["events"]}
    assert not kinds & {"training.job", "dataset.registered", "checkpoint.registered"}, kinds
    # It tried its harness variants on the instruct model and submitted a harness, nothing else.
    evaluated = _lines(r["log"], "evaluation")
    assert {e["model"] for e in evaluated} == {"tiny"} and len({e["harness"] for e in evaluated}) == 3, evaluated
    assert all(e["status"] == "succeeded" for e in evaluated), evaluated
    _variants_ran(r, evaluated)
    body = r["seen"]["submitted"]["body"]
    assert list(body) == ["harness"], body
    [submission] = _submissions(r)
    assert submission["checkpoint"] is None and submission["model"] == "tiny"
    best = max((e for e in evaluated), key=lambda e: e["score"])
    assert submission["harness"] == body["harness"] and r["seen"]["best"]["score"] == best["score"]


def test_on_the_joint_track_it_trains_evaluates_records_and_submits_the_best_accepted_system(runs: dict[str, Any]) -> None:
    r = runs["joint"]
    assert r["shown"]["status"] == "exited" and r["shown"]["exit_code"] == 0, r["log"]
    seen = r["seen"]
    assert seen["generated"]["rows"] == 24  # the stand-in teacher answered every question with an integer
    # It asked only the benchmark's training pool (never questions it made up in the benchmark's form).
    pool = {json.loads(line)["question"] for line in (BENCHMARKS / "arithmetic" / "train.jsonl").read_text().splitlines()}
    [dataset] = [e["data"] for e in r["events"] if e["kind"] == "dataset.registered"]
    blob = r["gym_dir"] / "datasets" / f"{dataset['sha256']}.jsonl"
    asked = [json.loads(line)["messages"][0]["content"] for line in blob.read_text().splitlines()]
    assert len(asked) == 24 and set(asked) <= pool, asked
    assert seen["trained"]["status"] == "succeeded" and seen["trained"]["checkpoints"], seen["trained"]
    checkpoint = seen["trained"]["checkpoints"][-1]
    services = {row["service"] for row in r["ledger"]}
    assert {"rollout", "training", "inference", "sandbox"} <= services, services  # evaluation: tokens + sandbox seconds
    evaluated = {(e["model"], e["harness"]): e for e in _lines(r["log"], "evaluation")}
    assert ("tiny", "minimal") in evaluated and (checkpoint, "minimal") in evaluated, evaluated
    variants = [e for (m, h), e in evaluated.items() if h != "minimal"]
    assert len(variants) == 2 and {e["model"] for e in variants} == {checkpoint}
    _variants_ran(r, list(evaluated.values()))
    # Its records: one experiment per step, each with its hypothesis, and a finding per evaluation.
    experiments = {e["id"]: e for e in r["experiments"]}
    mine = {e["id"]: e for e in _lines(r["log"], "experiment")}
    assert set(mine) <= set(experiments) and len(mine) == 4
    assert all(experiments[x]["status"] == "pending" for x in mine)  # no audit has flagged them
    kinds = {e["kind"] for e in r["events"]}
    assert {"dataset.registered", "training.job", "checkpoint.registered", "harness.uploaded"} <= kinds, kinds
    # The submission: a checkpoint and a harness, the best of the accepted dev systems holding a checkpoint.
    [submission] = _submissions(r)
    body = seen["submitted"]["body"]
    assert set(body) == {"checkpoint", "harness"} and body["checkpoint"] == checkpoint
    best = max((e for e in evaluated.values() if e["model"] == checkpoint), key=lambda e: e["score"])
    assert seen["best"]["score"] == best["score"] and submission["checkpoint"] == checkpoint
    assert submission["harness"] == body["harness"]


def _variants_ran(r: dict[str, Any], evaluated: list[dict[str, Any]]) -> None:
    """Every trial of every evaluation ran without error; in a variant's trials the wrapper ran the
    minimal harness as often as its mode says (vote: every sample; retry: until an integer answer)."""
    for e in evaluated:
        trials = r["results"][e["job"]]
        assert trials and all(t["error"] is None and t["trajectory"]["steps"] for t in trials), trials
        if e["harness"] == "minimal":
            continue
        for t in trials:
            # agent_output: "exit code: N", then the harness's stdout and stderr; the wrapper's summary line
            [summary] = [json.loads(line) for line in t["agent_output"].splitlines() if line.startswith('{"variant"')]
            answers = summary["answers"]
            if summary["variant"] == "vote":
                assert len(answers) == 2, summary
            else:
                assert answers[:-1] == [None] * (len(answers) - 1) and 1 <= len(answers) <= 3, summary
            valid = [a for a in answers if a is not None]
            assert summary["chosen"] == (max(valid, key=valid.count) if valid else None), summary


def _submissions(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's submissions as the platform recorded them."""
    return [e["data"] for e in r["events"] if e["kind"] == "submission.created"]
