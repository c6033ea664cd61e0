"""The recursive loop, as ``rsigym demo --generations N`` runs it (shortened: the arithmetic
benchmark cut to 4 tasks a split): generation 1 is the baseline agent from the base model,
generation 2 the baseline agent from generation 1's accepted system (``--from``), generation 3 the
research DAG agent from generation 2's, its Main model served by the gym from generation 2's
checkpoint (``--agent-model gym:from:RUN``).

After the demo (its gym down, its data dir kept), the store says what each generation started from
and how it was scored: generation 2's initial system is generation 1's submitted system (same
checkpoint, same weights hash, same harness), scored on the same official tasks. (Official scoring
samples as the harness asks, so the same system's avg@3 varies between scorings; that it scores the
same greedily is tested in tests/e2e/test_generations_from.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa

from ops.demo_generations import run_generations_demo
from tests.fakes.servers import free_port


def _rows(data: Path, query: str, **params: object) -> list[dict[str, object]]:
    engine = sa.create_engine(f"sqlite:///{data / 'gym.sqlite3'}")
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.text(query), params)]
    finally:
        engine.dispose()


def test_three_generations_each_start_from_the_last_accepted_system(tmp_path: Path) -> None:
    data = tmp_path / "gens"
    code = run_generations_demo(3, data_dir=data, port=free_port(), tasks_per_split=4,
                                agents=["baseline", "baseline", "dag"], research_model_from_previous=True,
                                watch_every_s=3600)
    assert code == 0, (data / "gym.log").read_text()[-3000:]

    generations = _rows(data, "SELECT * FROM run_generations ORDER BY generation")
    assert [g["generation"] for g in generations] == [2, 3]
    gen2, gen3 = generations
    gen1_run = gen2["from_run_id"]
    assert gen3["from_run_id"] == gen2["run_id"] and gen3["chain_root_id"] == gen2["chain_root_id"] == gen1_run

    # generation 2 starts from generation 1's submitted system, byte for byte
    [sub1] = _rows(data, "SELECT * FROM submissions WHERE id = :id", id=gen2["submission_id"])
    assert sub1["run_id"] == gen1_run
    assert (gen2["initial_model"], gen2["initial_harness"]) == (sub1["checkpoint_id"], sub1["harness"])
    [ckpt1] = _rows(data, "SELECT * FROM checkpoints WHERE id = :id", id=sub1["checkpoint_id"])
    assert ckpt1["run_id"] == gen1_run and gen2["initial_weights_hash"] == ckpt1["weights_hash"]

    # generation 2's baseline is that system, scored on the same official tasks as generation 1's submission
    scores = _rows(data, "SELECT s.run_id, s.model, s.harness, s.submission_id, s.attempts, j.task_ids, j.score "
                         "FROM scores s JOIN evaluation_jobs j ON j.id = s.job_id "
                         "WHERE s.split = 'official' AND j.status = 'succeeded'")
    [submitted1] = [s for s in scores if s["run_id"] == gen1_run and s["submission_id"] == sub1["id"]]
    [initial2] = [s for s in scores if s["run_id"] == "initial" and s["model"] == sub1["checkpoint_id"]
                  and s["harness"] == sub1["harness"]]
    assert (initial2["task_ids"], initial2["attempts"]) == (submitted1["task_ids"], submitted1["attempts"])

    # generation 3's researcher thought with generation 2's checkpoint, served by the gym on the agent route
    [key3] = _rows(data, "SELECT agent, agent_model FROM api_keys WHERE id = :id", id=gen3["run_id"])
    assert key3 == {"agent": "dag", "agent_model": f"gym:from:{gen2['run_id']}"}
    turns = _rows(data, "SELECT count(*) AS n FROM agent_turns WHERE run_id = :r", r=gen3["run_id"])
    assert turns[0]["n"] >= 2  # the plan and at least one decision

    # the chain's report: generations 0..3 per benchmark, each run against its start and against generation 0
    report = json.loads((data / "report" / "report.json").read_text())
    [chain] = [c for c in report["chains"] if c["run_id"] == gen3["run_id"]]
    assert [g["generation"] for g in chain["runs"]] == [1, 2, 3]
    [arithmetic] = [b for b in chain["benchmarks"] if b["benchmark"] == "arithmetic"]
    assert [p["generation"] for p in arithmetic["points"]] == [0, 1, 2, 3]
    assert all(p["score"] is not None for p in arithmetic["points"])
    assert (data / "report" / chain["figure"]).is_file()
    [run3] = [r for r in report["runs"] if r["run_id"] == gen3["run_id"]]
    assert run3["generation"]["generation"] == 3 and run3["generation"]["rsi_index_vs_generation_0"]["rsi_index"] > 0
