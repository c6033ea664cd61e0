"""A live embedded gym on a loopback port with a small benchmark: for tests that run real
evaluations (trials in bubblewrap sandboxes, Harbor's verifier) in seconds, not minutes."""

from __future__ import annotations

import io
import re
import shutil
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

import rsigym
from kit.config import EvaluationConfig, GymConfig, SandboxConfig
from kit.settings import GymSettings, ProviderSecrets
from ops.builder import Gym, build_embedded
from services.evaluation.benchmarks import TaskRef
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, admin_headers
from tests.fakes.servers import serve_gym

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
FINAL = ("succeeded", "failed", "cancelled")


def mini_benchmark(dest: Path, *, name: str = "mini", per_split: int = 2, shared_verifier: bool = False) -> Path:
    """The arithmetic benchmark cut to ``per_split`` tasks a split, as a benchmark of its own (with the
    arithmetic training pool): its first dev tasks, and an official split of ``per_split`` tasks that the
    gym generates at registration, as it does the bundled one's (the repository holds no official task).

    ``shared_verifier``: drop the tasks' ``environment_mode = "separate"``, so they ask Harbor for
    its default (the verifier in the agent's own environment) — to prove the gym does not
    depend on the task to separate them. Generated tasks take their run settings from the dev tasks,
    so this (and the 60 s agent timeout) holds for the official ones too."""
    root = dest / name
    source = BENCHMARKS / "arithmetic"
    root.mkdir(parents=True)
    header = (source / "benchmark.toml").read_text().replace('name = "arithmetic"', f'name = "{name}"')
    (root / "benchmark.toml").write_text(re.sub(r"(?m)^count = \d+$", f"count = {per_split}", header))
    shutil.copy2(source / "train.jsonl", root / "train.jsonl")  # the training pool: disjoint from every task
    for task in sorted((source / "dev").iterdir())[:per_split]:
        shutil.copytree(task, root / "dev" / task.name)
        toml = root / "dev" / task.name / "task.toml"
        text = toml.read_text().replace("[agent]\ntimeout_sec = 300.0", "[agent]\ntimeout_sec = 60.0")
        if shared_verifier:
            text = text.replace('environment_mode = "separate"\n', "")
        toml.write_text(text)
    return root


def registered_tasks(gym: Gym, name: str, split: str = "official") -> list[TaskRef]:
    """The tasks of a registered benchmark's split, from the gym's own copy (where a generated
    split's tasks are: the operator's side of the gym, never the repository)."""
    return gym.service_apps["evaluation"].state.evaluation.registry.load(name).splits[split].tasks


def harness_archive(name: str, script: str) -> bytes:
    """A harness whose ``run`` is one bash script (what an agent would upload)."""
    return archive_of({"harness.toml": f'[harness]\nname = "{name}"\nrun = "/bin/bash /harness/run.sh"\n',
                       "run.sh": script})


def archive_of(files: dict[str, str]) -> bytes:
    """A .tar.gz of ``files`` (path -> text), each executable."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class LiveGym:
    def __init__(self, url: str, gym: Gym):
        self.url, self.gym = url, gym
        self.http = httpx.Client(base_url=url, timeout=120, headers=admin_headers())

    def key(self, budget: float = 5.0, track: str = "joint") -> dict[str, Any]:
        r = self.http.post("/admin/v1/keys", json={"track": track, "budget_usd": budget})
        assert r.status_code == 201, r.text
        return r.json()

    def agent(self, key: dict[str, Any]) -> httpx.Client:
        """Raw HTTP as the agent."""
        return httpx.Client(base_url=self.url, timeout=120, headers={"Authorization": f"Bearer {key['key']}"})

    def sdk(self, key: dict[str, Any]) -> rsigym.Gym:
        """The SDK as the agent."""
        return rsigym.Gym(base_url=self.url, api_key=key["key"], timeout=120)

    def register(self, path: Path, timeout: float = 300, **headers: str) -> dict[str, Any]:
        r = self.http.post("/admin/v1/benchmarks", json={"path": str(path)}, headers=headers)
        assert r.status_code == 201, r.text
        return self.wait_benchmark(r.json()["name"], timeout)

    def wait_benchmark(self, name: str, timeout: float = 900) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = {b["name"]: b for b in self.http.get("/admin/v1/benchmarks").json()["data"]}
            if rows[name]["status"] != "validating":
                return rows[name]
            time.sleep(0.5)
        raise AssertionError(f"benchmark {name} still validating after {timeout} s")

    def wait_job(self, agent: httpx.Client, job_id: str, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = agent.get(f"/evaluation/v1/jobs/{job_id}").json()
            if job["status"] in FINAL:
                return job
            time.sleep(0.5)
        raise AssertionError(f"evaluation job {job_id} did not finish in {timeout} s")

    def scores(self, benchmark: str) -> list[dict[str, Any]]:
        return [s for s in self.http.get("/admin/v1/scores").json()["data"] if s["benchmark"] == benchmark]

    def wait_scores(self, benchmark: str, run_ids: set[str], timeout: float = 600) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            by_run = {s["run_id"]: s for s in self.scores(benchmark)}
            if run_ids <= set(by_run) and all(by_run[r]["status"] in FINAL for r in run_ids):
                return by_run
            time.sleep(1)
        raise AssertionError(f"scores of {sorted(run_ids)} on {benchmark} not done in {timeout} s")


@contextmanager
def live_gym(data_dir: Path, *, trial_concurrency: int = 4, sandbox: SandboxConfig | None = None,
             config: GymConfig | None = None, secrets: dict[str, str] | None = None) -> Iterator[LiveGym]:
    """An embedded gym served on a free loopback port (as ``rsigym up`` serves it). ``config``
    (e.g. with a rollout catalogue and an audit judge) gets the evaluation and sandbox settings
    here; ``secrets``: the provider keys its catalogue names. Without one: the default config, its
    instruct model the tiny one (tests/conftest.py: ``tiny_instruct``)."""
    from tests.conftest import tiny_instruct

    config = (config or tiny_instruct(GymConfig())).model_copy(update={
        "evaluation": EvaluationConfig(workers=2, trial_concurrency=trial_concurrency),
        "sandbox": sandbox or SandboxConfig()})
    gym = build_embedded(GymSettings(data_dir=data_dir, admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR),
                         config=config, provider_secrets=ProviderSecrets(secrets or {}), run_reaper=False)
    try:
        with serve_gym(gym) as url:
            live = LiveGym(url, gym)
            try:
                yield live
            finally:
                live.http.close()
    finally:  # the server's lifespan closed the services; stop the job workers too
        for name in ("evaluation", "training"):
            getattr(gym.service_apps[name].state, name).runner.shutdown()


@contextmanager
def judged_gym(data_dir: Path, bench_dir: Path, standin_url: str, teacher_secret: str, *,
               per_split: int = 2) -> Iterator[LiveGym]:
    """A live gym whose audits ask the stand-in judge through its rollout service (so a clean run
    can be ``accepted``), with ``mini`` (``per_split`` tasks a split) registered and validated."""
    from tests.conftest import TEACHER_ENV, gym_config

    config = gym_config(standin_url)
    config.audit.judge_model = "judge"
    with live_gym(data_dir, config=config, secrets={TEACHER_ENV: teacher_secret}) as served:
        row = served.register(mini_benchmark(bench_dir, name="mini", per_split=per_split))
        assert row["status"] == "ready", row
        yield served
