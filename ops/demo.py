"""``rsigym demo --walkthrough``: start a throw-away embedded gym and walk one client through every service.

Operator and agent do what they would in a real run, through the real interfaces:
the operator creates a run key with the `rsigym` CLI; the agent checks its balance, calls a
rollout model (plain and streamed), uploads subtraction data, trains a LoRA adapter on the
base model (tiny by default, SmolLM2 with ``--model smollm2``), and compares base and checkpoint
on held-out questions through the inference service; a narrower child key for a reviewer role
spends its sub-budget until the gateway refuses with 402; the operator revokes the child and
reads the itemized ledger. The frontier model is the offline stand-in provider
(services/rollout/standin.py), reached through LiteLLM exactly like a real provider.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit.settings import default_models_dir
from ops.demo_common import (
    BENCHMARKS,
    background_process,
    console,
    demo_data_dir,
    own_gym,
    pick_port,
    rsigym_cli,
    trimmed_benchmarks,
)

if TYPE_CHECKING:
    from rsigym import Gym

DEMO_KEY_ENV = "RSIGYM_DEMO_TEACHER_KEY"


# tiny: 800 steps at 6e-3, the recipe that learns held-out subtraction on every build of the base model
# measured (0.95-1.0 dev); at 400 steps some builds have not started to learn yet (services/models/tiny.py).
TRAIN: dict[str, dict[str, Any]] = {"tiny": {"steps": 800, "learning_rate": 6e-3, "batch_size": 16, "schedule": "linear"},
         "smollm2": {"steps": 120, "learning_rate": 1e-3, "batch_size": 16}}


HARNESS_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
                 for n in ("bash", "read_file", "write_file", "finish")]
"""The minimal harness's tools: training in the prompt shape the harness will ask in."""


def _benchmark_questions() -> set[str]:
    """The questions the repository publishes (the dev split; the official one is drawn by the gym)."""
    return {p.read_text().strip() for p in (BENCHMARKS / "arithmetic").glob("*/*/instruction.md")}


def _train_and_compare(gym: Gym, base: str, questions: int = 50) -> tuple[float, float, str]:
    import random

    from services.models.synthetic import subtraction

    # Never a benchmark question: the benchmark's training pool (questions no task of any split asks,
    # the hidden official one included, which the gym drew at registration and nobody here can read),
    # answered by arithmetic, plus questions outside its space (a number under 10, or a - a).
    rows: list[dict[str, Any]] = []
    for question in gym.evaluation.training_pool("arithmetic"):
        a, b = (int(x) for x in question.removeprefix("What is ").removesuffix("?").split(" - "))
        rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": str(a - b)}],
                     "tools": HARNESS_TOOLS})
    rng = random.Random(7)
    while len(rows) < 3000:
        messages = subtraction(rng)
        a, b = (int(x) for x in messages[0]["content"].removeprefix("What is ").removesuffix("?").split(" - "))
        if b < 10 or a == b:
            rows.append({"messages": messages, "tools": HARNESS_TOOLS})
    seen, banned = {r["messages"][0]["content"] for r in rows}, _benchmark_questions()
    dataset = gym.training.upload_dataset(rows, name="subtraction")
    console.print(f"uploaded dataset {dataset.id}: {dataset.rows} rows, sha256 {dataset.sha256[:12]}…")
    job = gym.training.create_job(datasets=[dataset.id], base_model=base, max_length=64, seed=1,
                                  checkpoint_every=100, **TRAIN[base])
    with console.status(f"training {job.id} on {base}") as status:
        while not job.done:
            time.sleep(2)
            job = gym.training.get_job(job.id)
            last = job.metrics[-1] if job.metrics else None
            if last:
                status.update(f"training {job.id}: step {last.step}/{job.total_steps} loss {last.loss:.3f} "
                              f"cost ${last.cumulative_cost_usd:.4f}")
    console.print(f"job {job.status} after {job.step} steps, ${job.cost_usd:.4f}; checkpoints {job.checkpoints}")
    if not job.checkpoints:
        raise SystemExit(f"training job {job.id} ended {job.status} without a checkpoint")
    trained = job.checkpoints[-1]
    held: list[tuple[str, str]] = []
    qrng = random.Random(4242)
    while len(held) < questions:
        user, answer = subtraction(qrng)
        if user["content"] not in seen and user["content"] not in banned:
            held.append((user["content"], answer["content"]))

    def score(model: str) -> float:
        right = 0
        for q, a in held:
            reply = gym.inference.chat(model=model, messages=[{"role": "user", "content": q}],
                                       tools=HARNESS_TOOLS, max_tokens=6, temperature=0)
            right += (reply.choices[0].message.content or "").strip() == a
        return right / len(held)

    return score(base), score(trained), trained


def _sandbox(url: str, key: str) -> None:
    """The agent's unmodified e2b SDK against the gym."""
    from e2b import Sandbox

    sbx = Sandbox.create(template="base", timeout=120, api_key=key, api_url=f"{url}/sandbox",
                         sandbox_url=f"{url}/sandbox/envd")
    try:
        sbx.files.write("/home/user/hello.py", "print(6 * 7)")
        run = sbx.commands.run("python3 hello.py; curl -s -m 2 http://example.com >/dev/null || echo no-network")
        console.print(f"e2b sandbox {sbx.sandbox_id}: {run.stdout.split()} exit {run.exit_code}; "
                      f"files {[e.name for e in sbx.files.list('/home/user')]}")
    finally:
        sbx.kill()


def _evaluate(gym: Gym, base: str, checkpoint: str, tasks: int = 30) -> tuple[float, float]:
    deadline = time.monotonic() + 900
    with console.status("waiting for the arithmetic benchmark's validation (every oracle 1, every empty answer 0)"):
        while time.monotonic() < deadline:
            bench = {b.name: b for b in gym.evaluation.benchmarks()}.get("arithmetic")
            if bench is not None and bench.status != "validating":
                break
            time.sleep(2)
    if bench is None or bench.status != "ready":
        raise SystemExit(f"the arithmetic benchmark is not ready: {bench}")
    jobs = {m: gym.evaluation.run("arithmetic", model=m, split="dev", limit=tasks)
            for m in (base, checkpoint)}
    done = {}
    with console.status(f"evaluating base and checkpoint on {tasks} arithmetic dev tasks with the minimal harness"):
        for m, job in jobs.items():
            done[m] = gym.evaluation.wait(job.id, timeout=900)
    for m, job in done.items():
        console.print(f"evaluation {job.id}: {m} + minimal → {job.score:.3f} ({job.progress.done} trials)")
        unverified = [r.error for r in gym.evaluation.results(job.id) if r.reward is None]
        if job.status != "succeeded" or job.progress.done != job.progress.total or unverified:
            raise SystemExit(f"evaluation {job.id} ended {job.status} with {len(unverified)} trials unverified: "
                             f"{unverified[:1]}")
    return done[base].score or 0.0, done[checkpoint].score or 0.0


def _own_standin(port: int, secret: str) -> Callable[[], bool]:
    """The stand-in the demo started answers its key (another server on the port does not)."""
    import httpx

    def ready() -> bool:
        body = {"model": "teacher", "messages": [{"role": "user", "content": "1 + 1"}], "max_tokens": 1}
        return httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {secret}"}, timeout=2).status_code == 200
    return ready


def run_demo(data_dir: Path | None = None, port: int = 8700, model: str = "tiny", models_dir: Path | None = None,
             tasks_per_split: int | None = None, keep: bool = False) -> int:
    """The demo; ``tasks_per_split`` shortens it (the test suite's run): the arithmetic benchmark is
    cut to its first N tasks of each split, so validation, evaluation and scoring run fewer trials.
    Its gym is its own: on ``port`` or a free one if that is busy; in ``data_dir``, or a fresh one
    removed at the end unless ``keep``."""
    with demo_data_dir(data_dir, "rsigym-demo-", keep) as data:
        port = pick_port(port)
        return _run_demo(data, port, pick_port(port + 99, "the demo's stand-in provider"), model, models_dir,
                         tasks_per_split)


def _run_demo(data: Path, port: int, provider_port: int, model: str, models_dir: Path | None,
              tasks_per_split: int | None) -> int:
    from rsigym import BudgetExhaustedError, Gym  # the agent side: the SDK only

    provider_secret = "sk-demo-" + secrets.token_hex(16)
    config = data / "gym.toml"
    config.write_text(
        f"""[ledger]
reservation_ttl_s = 600

[rollout]
default_max_tokens = 64

[[rollout.models]]
name = "teacher"
litellm_model = "openai/teacher"
api_base = "http://127.0.0.1:{provider_port}/v1"
api_key_env = "{DEMO_KEY_ENV}"
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0

[[rollout.models]]
name = "judge"
litellm_model = "openai/judge"
api_base = "http://127.0.0.1:{provider_port}/v1"
api_key_env = "{DEMO_KEY_ENV}"
input_usd_per_mtok = 3.0
output_usd_per_mtok = 15.0

[audit]
judge_model = "judge"

[[models]]
name = "tiny"
path = "builtin:tiny"
train_usd_per_mtok = 2.0
prefill_usd_per_mtok = 0.2
sample_usd_per_mtok = 0.6
""" + ("""
[[models]]
name = "smollm2"
path = "builtin:smollm2"
train_usd_per_mtok = 4.0
prefill_usd_per_mtok = 0.4
sample_usd_per_mtok = 1.2
max_context = 2048
""" if model == "smollm2" else "")
    )
    url = f"http://127.0.0.1:{port}"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}
    models = models_dir or Path(os.environ.get("RSIGYM_MODELS_DIR") or default_models_dir())
    platform_env = {**base_env, DEMO_KEY_ENV: provider_secret, "RSIGYM_DATA_DIR": str(data), "RSIGYM_MODELS_DIR": str(models)}
    operator_env = {**base_env, "RSIGYM_URL": url, "RSIGYM_DATA_DIR": str(data)}
    python = sys.executable

    console.rule("[bold]RSIGym demo")
    console.print(f"data dir {data}")
    with background_process([python, "-m", "ops.cli.main", "standin", "--port", str(provider_port), "--api-key-env", DEMO_KEY_ENV],
                  platform_env, f"http://127.0.0.1:{provider_port}/v1/models", data / "standin.log",
                  ready=_own_standin(provider_port, provider_secret)), \
         background_process([python, "-m", "ops.cli.main", "up", "--config", str(config), "--data-dir", str(data), "--port", str(port)],
                  platform_env, f"{url}/healthz", data / "gym.log", start_timeout=1200, ready=own_gym(url, data)):
        console.print(f"[green]gym up[/green] at {url} (gateway + services, one process); admin token in {data / 'admin-token'}")

        console.rule("operator")
        created = json.loads(rsigym_cli("keys", "create", "--track", "joint", "--budget", "2", "--json", env=operator_env))
        console.print(f"rsigym keys create --track joint --budget 2 --json → id {created['id']}")
        arithmetic = BENCHMARKS / "arithmetic" if tasks_per_split is None else trimmed_benchmarks(
            data / "benchmarks", tasks_per_split, ("arithmetic",))[0]
        rsigym_cli("benchmarks", "register", str(arithmetic), env=operator_env)
        console.print(f"rsigym benchmarks register {arithmetic} → validating (oracle and empty runs, async)"
                      + ("" if tasks_per_split is None else f"; shortened: {tasks_per_split} tasks per split"))

        console.rule("agent")
        gym = Gym(base_url=url, api_key=created["key"])
        console.print(f"balance: {gym.balance().model_dump()}")
        console.print(f"models: {[(m.id, m.pricing) for m in gym.rollout.models()]}")
        reply = gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "What is 1234 + 4321?"}], max_tokens=16)
        console.print(f"chat: {reply.choices[0].message.content!r}  cost ${reply.cost_usd:.6f}  remaining ${reply.remaining_usd:.6f}")
        with gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "Describe research."}], max_tokens=24,
                              stream=True, stream_options={"include_usage": True}) as stream:
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        console.print(f"stream: {text[:70]!r}…  exact cost ${stream.cost_usd:.6f}")
        _sandbox(url, created["key"])
        base_acc, tuned_acc, checkpoint = _train_and_compare(gym, model)
        console.print(f"held-out subtraction exact match: base {model} {base_acc:.0%} → checkpoint {tuned_acc:.0%}")
        base_eval, tuned_eval = _evaluate(gym, model, checkpoint, tasks=min(30, tasks_per_split or 30))
        harness = gym.evaluation.upload_harness(BENCHMARKS.parent / "agent_container" / "harness" / "minimal")
        submission = gym.submit(checkpoint=checkpoint, harness=harness.id)
        console.print(f"submitted {submission.id}: checkpoint {checkpoint} + harness {harness.id} (minimal, as an archive)")
        reviewer = gym.keys.mint(name="reviewer", budget_usd=0.0003,
                                 policy={"services": {"rollout": {"models": ["teacher"], "max_concurrency": 2,
                                                                  "fields": {"temperature": {"fixed": 0.0}}}}})
        console.print(f"minted child key {reviewer.id} (rollout only, temperature fixed at 0, sub-budget $0.0003)")
        child = Gym(base_url=url, api_key=reviewer.key)
        try:
            child.rollout.chat(model="teacher", messages=[{"role": "user", "content": "x"}], temperature=0.9)
        except Exception as err:  # noqa: BLE001 - shown to the reader
            console.print(f"child asks for temperature 0.9 → {type(err).__name__}: {getattr(err, 'message', err)}")
        calls, refused = 0, None
        while refused is None and calls < 200:
            try:
                child.rollout.chat(model="teacher", messages=[{"role": "user", "content": "Keep talking."}], max_tokens=48)
                calls += 1
            except BudgetExhaustedError as err:
                refused = err
        balance, child_balance = gym.balance(), child.balance()
        console.print(f"the reviewer made {calls} calls, then 402 {refused.type if refused else '-'}; it spent "
                      f"${child_balance.spent_usd:.6f} of its ${child_balance.budget_usd:.6f}; the run spent "
                      f"${balance.spent_usd:.6f} of ${balance.budget_usd:.2f}, reserved ${balance.reserved_usd:.6f}")

        console.rule("operator")
        rsigym_cli("keys", "revoke", reviewer.id, env=operator_env)
        try:
            child.balance()
        except Exception as err:  # noqa: BLE001
            console.print(f"revoked child key → {type(err).__name__} ({getattr(err, 'status_code', '')})")
        ledger = rsigym_cli("ledger", created["id"], "--json", env=operator_env)
        rows = json.loads(ledger)["data"] if ledger.strip().startswith("{") else json.loads(ledger)
        by_service: dict[str, float] = {}
        for row in rows:
            by_service[row["service"]] = by_service.get(row["service"], 0.0) + (row.get("actual_usd") or 0.0)
        console.print(f"rsigym ledger {created['id']}: {len(rows)} rows; charged by service "
                      + ", ".join(f"{k} ${v:.6f}" for k, v in sorted(by_service.items())))

        def run_spent() -> float:  # the operator's view: scoring ends the run, its key is refused from then on
            return float(json.loads(rsigym_cli("keys", "show", created["id"], "--json", env=operator_env))["spent_usd"])

        spent_before_scoring = run_spent()
        audited = json.loads(rsigym_cli("audit", created["id"], "--json", "--out", str(data / "audit"), env=operator_env,
                                     ok_codes=(0, 2)))
        shown = [f"{c['name']} {c['verdict']}" for c in audited["checks"]]
        console.print(f"rsigym audit RUN: {audited['status']} (hacking rate {audited['hacking_rate']}); "
                      + ", ".join(shown) + f"; report {data / 'audit' / 'audit.md'}")
        console.print("rsigym score RUN --attempts 1 (the demo's shortcut; the official score is avg@3) …")
        rsigym_cli("score", created["id"], "--attempts", "1", "--benchmark", "arithmetic", "--wait", env=operator_env)
        print(rsigym_cli("report", "--out", str(data / "report"), "--split", "official", env=operator_env), flush=True)
        charts = sorted(p.name for p in (data / "report").glob("*.png"))
        console.print(f"report: {data / 'report'} (report.md, report.json, {', '.join(charts)}); scoring cost the run "
                      f"${run_spent() - spent_before_scoring:.6f}")
        # The checkpoint must beat the base on the 50 held-out questions, and through the harness on
        # the benchmark: strictly over the full run's 30 tasks; a shortened run's few tasks are a coin
        # flip for a checkpoint right on ~1 in 5 (all 4 missed: p ~ 0.45), so there it must not lose.
        evaluated = tuned_eval > base_eval if tasks_per_split is None else tuned_eval >= base_eval
        ok = (balance.spent_usd <= balance.budget_usd and balance.reserved_usd == 0 and refused is not None
              and audited["status"] == "accepted"
              and child_balance.spent_usd <= 0.0003 and tuned_acc > base_acc and evaluated
              and (data / "report" / "report.json").exists() and charts
              and run_spent() == spent_before_scoring)
        console.rule("[green]demo passed" if ok else "[red]demo failed")
        return 0 if ok else 1
