"""Generations (``rsigym run start --from RUN``): a run started from an earlier run's scored,
audit-accepted system, end to end on the tiny model.

Generation 1 trains a checkpoint for one step, uploads a harness and submits both; ``rsigym score
--wait`` ends, audits and scores it. Generation 2 is minted from it: its initial system is that
checkpoint (same weights hash) and harness, and evaluated greedily on the same tasks through the
same engine it scores and answers exactly as generation 1's submission did; its key may serve, train from and submit them — and
nothing else of generation 1 (another of its checkpoints stays 404, uncharged), while an unrelated
run may not touch the granted ones either. Generation 2's audit walks the checkpoint chain across
the runs and accepts it, showing generations 0 … 2. ``run start --from`` a run still running is
refused before a key exists."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from kit.config import GymConfig
from ops.cli.main import app as operator_cli
from rsigym import Gym
from services.training.checkpoints import Checkpoint
from storage.tables import ApiKey
from tests.conftest import ADMIN_TOKEN, admin_headers, bearer, create_key, gym_config
from tests.fakes.live_gym import harness_archive
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
ROOT = Path(__file__).resolve().parents[2]
TASKS = 2
CALCULATOR = r"""q="$(cat "${RSIGYM_TASK_INSTRUCTION_FILE:-/task/instruction.md}")"
if [[ $q =~ ([0-9]+)\ *([-+*])\ *([0-9]+) ]]; then
  echo $(( ${BASH_REMATCH[1]} ${BASH_REMATCH[2]} ${BASH_REMATCH[3]} )) > /app/answer.txt
fi
"""
ROWS = [{"messages": [{"role": "user", "content": f"Say the colour number {i}."},
                      {"role": "assistant", "content": f"Colour {i} is blue."}]} for i in range(8)]


def audit_config(api_base: str) -> GymConfig:
    config = gym_config(api_base)
    config.audit.judge_model = "judge"  # the stand-in provider answers the judge's prompt
    return config


@pytest.fixture
def served(make_gym: Callable[..., Any], standin: tuple[str, Any], pg_store: Any, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    gym = make_gym(store=pg_store, config=audit_config(standin[0]))  # PostgreSQL: scoring's trials write at once
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    monkeypatch.setenv("RSIGYM_DATA_DIR", str(data_dir))
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield url, gym
    gym.service_apps["evaluation"].state.evaluation.runner.wait_idle(timeout=120)


def rsigym(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args and code == 0 else result


def small_arithmetic(tmp_path: Path) -> Path:
    src, dest = ROOT / "benchmarks" / "arithmetic", tmp_path / "arith-gen"
    shutil.copytree(src, dest)
    for task in sorted((dest / "dev").iterdir())[TASKS:]:
        shutil.rmtree(task)
    toml = dest / "benchmark.toml"
    toml.write_text(toml.read_text().replace('name = "arithmetic"', 'name = "arith-gen"')
                    .replace("count = 60", f"count = {TASKS}"))
    return dest


def train(gym: Gym, **extra: Any) -> str:
    dataset = gym.training.upload_dataset(ROWS, name="colours")
    job = gym.training.wait(gym.training.create_job(datasets=[dataset.id], steps=1, batch_size=4,
                                                    learning_rate=1e-5, **extra).id, timeout=300, poll=1)
    assert job.status == "succeeded", (job.status, job.error)
    return str(job.checkpoints[-1])


def greedy(gym: Gym, model: str) -> tuple[float | None, list[float | None], list[str]]:
    """``model`` with the minimal harness on the dev tasks (temperature 0, one attempt): its score and
    rewards by task, and its greedy answers to a few prompts through inference."""
    job = gym.evaluation.wait(gym.evaluation.run("arith-gen", model=model, split="dev", limit=TASKS).id, timeout=300)
    assert job.status == "succeeded", job
    rewards = [r.reward for r in sorted(gym.evaluation.results(job.id), key=lambda r: r.task_id)]
    answers = [gym.inference.chat(model=model, messages=[{"role": "user", "content": q}], max_tokens=12,
                                  temperature=0).choices[0].message.content or ""
               for q in ("What is 7 - 3?", "Say the colour number 2.", "2+2=")]
    return job.score, rewards, answers


def spent(client: httpx.Client, key_id: str) -> float:
    return float(client.get(f"/admin/v1/keys/{key_id}", headers=admin_headers()).json()["spent_usd"])


def keys(gym: Any) -> int:
    with gym.gateway.store.transaction() as s:
        return s.query(ApiKey).count()


def chat(client: httpx.Client, key: str, model: str) -> httpx.Response:
    return client.post("/inference/v1/chat/completions", headers=bearer(key),
                       json={"model": model, "messages": [{"role": "user", "content": "2+2="}], "max_tokens": 2})


def test_second_generation_starts_from_the_first_accepted_system(served: tuple[str, Any], tmp_path: Path) -> None:
    url, gym_app = served
    assert rsigym("benchmarks", "register", str(small_arithmetic(tmp_path)), "--wait", "--json")["status"] == "ready"
    c = httpx.Client(base_url=url, timeout=120)
    gen1 = create_key(c, track="joint", name="gen1", budget_usd=5.0)
    with Gym(base_url=url, api_key=gen1["key"], max_retries=0) as gym:
        other_ckpt = train(gym, base_model="tiny")  # never submitted: not granted to anyone
        ckpt = train(gym, base_model="tiny")
        harness = gym.evaluation.upload_harness(harness_archive("calculator", CALCULATOR)).id
        gym.submit(checkpoint=ckpt, harness=harness)
        greedy1 = greedy(gym, ckpt)  # the submitted weights, greedily, as generation 1 sees them

    # Still running: refused, nothing minted (the operator CLI says why and exits 1).
    before = keys(gym_app)
    out = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "baseline", "--from", gen1["id"], code=1)
    assert "has not ended" in out.output, out.output
    assert keys(gym_app) == before

    scored = rsigym("score", gen1["id"], "--attempts", "1", "--wait", "--json")
    assert scored["audit"]["status"] == "accepted", scored["audit"]
    assert scored["audit_after_scoring"]["status"] == "accepted", scored
    integrity = c.get(f"/admin/v1/runs/{gen1['id']}/integrity", headers=admin_headers()).json()

    # `rsigym run start --from`: the run's record and its agent's instruction name the initial system.
    started = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "scripted", "--from", gen1["id"],
                     "--json")
    assert started["generation"] == 2 and started["from_run"] == gen1["id"]
    assert started["initial_system"]["model"] == ckpt and started["initial_system"]["harness"] == harness
    instruction = (tmp_path / "data" / "runs" / started["run"] / "instruction.md").read_text()
    assert "## Initial system (generation 2)" in instruction and f"Checkpoint `{ckpt}`" in instruction
    assert f"Harness `{harness}`" in instruction
    shown = rsigym("run", "show", started["run"], "--json")
    assert shown["generation"] == 2 and shown["initial_system"]["weights_hash"] == started["initial_system"]["weights_hash"]
    rsigym("run", "stop", started["run"])

    gen2 = create_key(c, track="joint", name="gen2", budget_usd=5.0,
                      run={"task": "joint-arithmetic", "agent": "baseline", "from_run": gen1["id"]})
    system = gen2["initial_system"]
    assert gen2["generation"] == 2 and gen2["from_run"] == gen1["id"]
    assert system["model"] == ckpt and system["harness"] == harness and system["base_model"] == "tiny"
    with gym_app.gateway.store.transaction() as s:
        assert system["weights_hash"] == s.get(Checkpoint, ckpt).weights_hash  # the same weights
    assert integrity["audit"]["status"] == "accepted"

    # The grant: gen 2 serves and trains from the initial checkpoint, evaluates and submits its harness.
    assert c.get(f"/training/v1/checkpoints/{ckpt}", headers=bearer(gen2["key"])).status_code == 200
    assert chat(c, gen2["key"], ckpt).status_code == 200
    with Gym(base_url=url, api_key=gen2["key"], max_retries=0) as gym:
        child = train(gym, parent_checkpoint=ckpt)
        gym.submit(checkpoint=child, harness=harness)
        dataset = gym.training.upload_dataset(ROWS, name="colours-again").id

    gen2_key = gen2["key"]
    # Generation 2's initial system is generation 1's submitted system: on the same dev tasks with the
    # minimal harness, greedily (temperature 0, the evaluation default) through the same engine, it
    # scores the same and answers the same text, token for token (tolerance: none).
    with Gym(base_url=url, api_key=gen2_key, max_retries=0) as gym:
        assert greedy(gym, ckpt) == greedy1
    # The records' lineage crosses runs: gen 2's checkpoint → the granted one (made by gen 1) → the base.
    found = c.get(f"/records/v1/checkpoints/{child}/lineage", headers=bearer(gen2_key)).json()
    assert [link["checkpoint"] for link in found["links"]] == [child, ckpt] and found["complete"], found
    assert "inherited" not in found["links"][0] and found["base_model"] == "tiny"
    assert found["links"][1]["inherited"] == {"run_id": gen1["id"], "generation": 1}
    granted_lineage = c.get(f"/records/v1/checkpoints/{ckpt}/lineage", headers=bearer(gen2_key))
    assert granted_lineage.status_code == 200 and granted_lineage.json()["links"][0]["inherited"]["generation"] == 1
    # Nothing else of gen 1: its other checkpoint stays 404 for gen 2, uncharged.
    before = spent(c, gen2["id"])
    assert c.get(f"/training/v1/checkpoints/{other_ckpt}", headers=bearer(gen2["key"])).status_code == 404
    assert c.get(f"/records/v1/checkpoints/{other_ckpt}/lineage", headers=bearer(gen2["key"])).status_code == 404
    assert chat(c, gen2["key"], other_ckpt).status_code == 404
    r = c.post("/training/v1/jobs", headers=bearer(gen2["key"]),
               json={"datasets": [dataset], "parent_checkpoint": other_ckpt, "steps": 1})
    assert r.status_code == 404, r.text
    assert spent(c, gen2["id"]) == before
    # An unrelated run may not touch the granted checkpoint or harness either.
    stranger = create_key(c, track="joint", name="stranger", budget_usd=1.0)
    assert c.get(f"/training/v1/checkpoints/{ckpt}", headers=bearer(stranger["key"])).status_code == 404
    assert c.get(f"/records/v1/checkpoints/{ckpt}/lineage", headers=bearer(stranger["key"])).status_code == 404
    assert chat(c, stranger["key"], ckpt).status_code == 404
    r = c.post("/evaluation/v1/submissions", headers=bearer(stranger["key"]),
               json={"checkpoint": ckpt, "harness": harness})
    assert r.status_code == 404, r.text
    r = c.post("/evaluation/v1/jobs", headers=bearer(stranger["key"]),
               json={"benchmark": "arith-gen", "model": "tiny", "harness": harness, "limit": 1})
    assert r.status_code == 404 and "harness" in r.text, r.text
    assert spent(c, stranger["id"]) == 0.0
    # Gen 2 may evaluate its granted harness (an evaluation job is accepted; not waited for).
    r = c.post("/evaluation/v1/jobs", headers=bearer(gen2_key),
               json={"benchmark": "arith-gen", "model": ckpt, "harness": harness, "limit": 1})
    assert r.status_code in (200, 201, 202), r.text

    # Gen 2's audit walks the chain into gen 1 and accepts it: generations 0 … 2.
    c.post(f"/admin/v1/keys/{gen2['id']}/end", json={"reason": "finished", "agent_exit": 0}, headers=admin_headers())
    response = c.post(f"/admin/v1/runs/{gen2['id']}/audit", headers=admin_headers())
    assert response.status_code == 200, response.text
    audit = response.json()
    provenance = next(ch for ch in audit["checks"] if ch["name"] == "provenance")
    assert provenance["verdict"] == "pass", provenance
    details = provenance["details"]
    print("\n" + json.dumps({"generations": details["generations"], "lineage": details["lineage"]}, indent=1))
    assert [g["generation"] for g in details["generations"]] == [0, 1, 2]
    lineage = {e["checkpoint"]: e for e in details["lineage"]}
    assert lineage[child]["run_owned"] and lineage[child]["generation"] == 2
    assert lineage[ckpt]["generation"] == 1 and lineage[ckpt]["granted"]
    assert lineage[ckpt]["inherited"].startswith(f"inherited from run {gen1['id']} (generation 1, accepted audit aud_")
    assert details["harness"]["run"] == gen1["id"] and not details["harness"]["owned"]
    assert audit["status"] == "accepted", audit

    # A checkpoint of gen 1 that is not the grant, spliced into gen 2's chain in the store, still flags.
    with gym_app.gateway.store.transaction() as s:
        s.execute(update(Checkpoint).where(Checkpoint.id == child).values(parent_checkpoint_id=other_ckpt))
    response = c.post(f"/admin/v1/runs/{gen2['id']}/audit", headers=admin_headers())
    provenance = next(ch for ch in response.json()["checks"] if ch["name"] == "provenance")
    assert provenance["verdict"] == "flag"
    assert any(f"checkpoint {other_ckpt} belongs to another run" in f["evidence"] for f in provenance["findings"])
    c.close()
