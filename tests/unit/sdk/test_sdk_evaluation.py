"""``gym.evaluation`` / ``gym.submit`` and ``gym eval|harness|submit`` against a real embedded gym
served on loopback: the real gateway, evaluation service and store (benchmark rows are put in
the store directly where a test needs one registered, so no validation job has to run)."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit.settings import StoreSettings
from rsigym import (
    APITimeoutError,
    AsyncGym,
    ConflictError,
    Gym,
    NotFoundError,
    PermissionDeniedError,
    UnprocessableEntityError,
    build_harness_archive,
    cli,
)
from rsigym.resources.evaluation import harness_archive_bytes
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.tables import BenchmarkRow
from storage.store import Store, sqlite_url
from tests.conftest import admin_headers, create_key
from tests.fakes.live_gym import mini_benchmark
from tests.fakes.servers import serve_gym

ROOT = Path(__file__).resolve().parents[3]
MINIMAL = ROOT / "agent_container" / "harness" / "minimal"
ARITHMETIC = ROOT / "benchmarks" / "arithmetic"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(sqlite_url(tmp_path / "db"), StoreSettings())
    s.migrate()
    yield s
    s.dispose()


@pytest.fixture
def served(make_gym: Callable[..., Any], store: Store) -> Iterator[str]:
    gym = make_gym(store=store)
    with serve_gym(gym) as url:
        yield url
    runner = gym.service_apps["evaluation"].state.evaluation.runner
    runner.wait_idle(timeout=120)


@pytest.fixture
def new_key(served: str) -> Callable[..., dict[str, Any]]:
    def make(track: str = "joint", **extra: Any) -> dict[str, Any]:
        with httpx.Client(base_url=served) as c:
            return create_key(c, track=track, **extra)

    return make


def client(served: str, key: dict[str, Any]) -> Gym:
    return Gym(base_url=served, api_key=key["key"], max_retries=0)


def register_directly(store: Store, *, name: str = "arithmetic", status: str = "ready") -> None:
    """A benchmark row as registration leaves it once validated (the bundled arithmetic tasks)."""
    with store.transaction() as s:
        s.add(BenchmarkRow(name=name, version="1.0.0", description="test", path=str(ARITHMETIC),
                           splits={"dev": {"hidden": False, "tasks": 60}, "official": {"hidden": True, "tasks": 60}},
                           validation={"status": status, "tasks": 120}))


def my_harness(tmp_path: Path, name: str = "mine") -> Path:
    src = tmp_path / "my-harness"
    shutil.copytree(MINIMAL, src, ignore=shutil.ignore_patterns("__pycache__"))
    manifest = src / "harness.toml"
    manifest.write_text(manifest.read_text().replace('name = "minimal"', f'name = "{name}"'))
    (src / "lib").mkdir()
    (src / "lib" / "notes.txt").write_text("vendored\n")
    return src


def tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# ---- what the SDK sends, and wait() (a fake gateway) ---------------------------------------


def job_body(status: str, done: int, total: int = 2, score: float | None = None) -> dict[str, Any]:
    return {"id": "evj_1", "object": "evaluation.job", "status": status, "benchmark": "b", "split": "dev",
            "model": "tiny", "harness": "minimal", "attempts": 1, "tasks": 2, "score": score,
            "progress": {"done": done, "total": total}, "detail": "full"}


def test_requests_and_wait_against_a_fake_gateway(gateway: Any, tmp_path: Path) -> None:
    gateway.route("POST", "/evaluation/v1/jobs", gateway.ok(job_body("queued", 0), status=201))
    gateway.route("GET", "/evaluation/v1/jobs/evj_1", gateway.ok(job_body("queued", 0)),
                  gateway.ok(job_body("running", 1)), gateway.ok(job_body("running", 1)),
                  gateway.ok(job_body("succeeded", 2, score=0.5)))
    gateway.route("POST", "/evaluation/v1/harnesses", gateway.ok({"id": "hrn_1", "name": "mine", "sha256": "0" * 64}))
    with gateway.gym() as gym:
        job = gym.evaluation.run("b", "tiny", sampling={"temperature": 0.5}, limit=2)
        assert gateway.json_sent() == {"benchmark": "b", "model": "tiny", "split": "dev", "harness": "minimal",
                                       "attempts": 1, "sampling": {"temperature": 0.5}, "limit": 2}
        seen: list[tuple[str, int]] = []
        final = gym.evaluation.wait(job.id, poll_s=0, on_progress=lambda j: seen.append((j.status, j.progress.done)))
        assert (final.status, final.score, final.done) == ("succeeded", 0.5, True)
        assert seen == [("queued", 0), ("running", 1), ("succeeded", 2)]

        gym.evaluation.upload_harness(my_harness(tmp_path))
        sent = gateway.calls("POST", "/evaluation/v1/harnesses")[-1]
        assert sent.headers["content-type"] == "application/gzip"
        assert sent.content == harness_archive_bytes(tmp_path / "my-harness")

        gateway.route("GET", "/evaluation/v1/jobs/evj_1", gateway.ok(job_body("running", 1)))
        with pytest.raises(APITimeoutError, match="keeps running"):
            gym.evaluation.wait("evj_1", poll_s=0, timeout=0)


# ---- benchmarks ----------------------------------------------------------------------------


def test_benchmarks_hide_hidden_splits_from_agents(served: str, store: Store, new_key: Callable[..., dict[str, Any]]) -> None:
    register_directly(store)
    with client(served, new_key()) as gym:
        (bench,) = gym.evaluation.benchmarks()
    assert bench.name == "arithmetic" and bench.ready and bench.version == "1.0.0"
    assert list(bench.splits) == ["dev"] and bench.splits["dev"].tasks == 60 and not bench.splits["dev"].hidden
    assert bench.validation is None  # validation details are for operators
    operator = httpx.get(f"{served}/admin/v1/benchmarks", headers=admin_headers()).json()["data"]
    assert set(operator[0]["splits"]) == {"dev", "official"} and operator[0]["validation"]["status"] == "ready"


def test_agents_read_the_training_pool_and_nothing_else(served: str, store: Store,
                                                       new_key: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    """The pool comes through the gateway as the registered copy holds it; a benchmark without one,
    and a name that tries to walk out of the registry, get the standard 404."""
    registry = BenchmarkRegistry(store, tmp_path / "registry")
    registry.register(mini_benchmark(tmp_path / "src", name="arithmetic"))
    register_directly(store, name="bare")  # path: the bundled arithmetic, but no pool on its row
    pool = (ARITHMETIC / "train.jsonl").read_text()
    key = new_key(track="data")
    with client(served, key) as gym:
        listed = {b.name: b for b in gym.evaluation.benchmarks()}
        assert listed["arithmetic"].training_pool == {"rows": 2000, "sha256": hashlib.sha256(pool.encode()).hexdigest()}
        assert listed["bare"].training_pool is None
        questions = gym.evaluation.training_pool("arithmetic")
        assert questions == [json.loads(line)["question"] for line in pool.splitlines()]
        with pytest.raises(NotFoundError) as none:
            gym.evaluation.training_pool("bare")
        assert none.value.param == "benchmark" and "no training pool" in none.value.message
        for name in ("nope", "..%2F..%2Fsecrets", "arithmetic%2F..%2Fbare"):
            r = httpx.get(f"{served}/evaluation/v1/benchmarks/{name}/training-pool",
                          headers={"Authorization": f"Bearer {key['key']}"})
            assert r.status_code == 404 and r.json()["error"]["type"] and "question" not in r.text


def test_jobs_on_missing_hidden_or_unready_benchmarks_are_refused(
    served: str, store: Store, new_key: Callable[..., dict[str, Any]]
) -> None:
    register_directly(store)
    register_directly(store, name="pending", status="validating")
    with client(served, new_key()) as gym:
        with pytest.raises(NotFoundError) as missing:
            gym.evaluation.run("no-such-benchmark", model="tiny")
        assert missing.value.param == "benchmark" and missing.value.request_id
        with pytest.raises(NotFoundError) as hidden:
            gym.evaluation.run("arithmetic", model="tiny", split="official")
        assert hidden.value.param == "split"
        with pytest.raises(NotFoundError) as model:
            gym.evaluation.run("arithmetic", model="ckpt_not_mine")
        assert model.value.param == "model"
        with pytest.raises(ConflictError):
            gym.evaluation.run("pending", model="tiny")
        with pytest.raises(NotFoundError):
            gym.evaluation.run("arithmetic", model="tiny", harness="hrn_not_mine")
        with pytest.raises(NotFoundError):
            gym.evaluation.get("evj_nope")
        with pytest.raises(NotFoundError):
            gym.evaluation.results("evj_nope")
        assert gym.evaluation.jobs() == []


# ---- harness archives ----------------------------------------------------------------------


def test_build_harness_archive_is_deterministic_and_normalized(tmp_path: Path) -> None:
    src = my_harness(tmp_path)
    first = build_harness_archive(src, tmp_path / "a.tar.gz")
    (src / "lib" / "notes.txt").touch()  # a new mtime changes nothing
    second = build_harness_archive(src, tmp_path / "b.tar.gz")
    assert first.read_bytes() == second.read_bytes() == harness_archive_bytes(src)
    with tarfile.open(first) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and "harness.toml" in names and "lib" in names and "lib/notes.txt" in names
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in members)
    assert all(m.isreg() or m.isdir() for m in members)

    (src / "link").symlink_to("harness.toml")
    with pytest.raises(ValueError, match="symlink"):
        build_harness_archive(src, tmp_path / "c.tar.gz")
    (src / "link").unlink()
    (src / "harness.toml").unlink()
    with pytest.raises(ValueError, match="harness.toml"):
        harness_archive_bytes(src)
    assert not (tmp_path / "c.tar.gz").exists()


def test_upload_a_directory_built_harness(served: str, new_key: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    src = my_harness(tmp_path)
    with client(served, new_key(track="harness")) as gym:
        harness = gym.evaluation.upload_harness(src)  # a directory: archived by the SDK
        assert harness.id.startswith("hrn_") and harness.name == "mine" and harness.request_id
        assert harness.manifest["run"].startswith("/usr/bin/python3") and harness.files == 4
        archive = build_harness_archive(src, tmp_path / "mine.tar.gz")
        assert gym.evaluation.upload_harness(archive).id == harness.id  # same bytes: the same harness
        assert gym.evaluation.upload_harness(archive.read_bytes()).id == harness.id
        assert [h.id for h in gym.evaluation.harnesses()] == [harness.id]
    with client(served, new_key(track="harness")) as other:
        assert other.evaluation.harnesses() == []  # another run's harnesses are not listed


def test_refused_archives_are_unprocessable(served: str, new_key: Callable[..., dict[str, Any]]) -> None:
    manifest = b'[harness]\nname = "evil"\nrun = "true"\n'
    with client(served, new_key(track="harness")) as gym:
        with pytest.raises(UnprocessableEntityError) as escape:
            gym.evaluation.upload_harness(tar_gz({"harness.toml": manifest, "../escape": b"x"}))
        assert escape.value.status_code == 422 and escape.value.param == "archive" and "'..'" in escape.value.message
        with pytest.raises(UnprocessableEntityError, match="harness.toml"):
            gym.evaluation.upload_harness(tar_gz({"main.py": b"print()"}))
        with pytest.raises(UnprocessableEntityError, match="not a valid"):
            gym.evaluation.upload_harness(b"not a tarball")
        assert gym.evaluation.harnesses() == []


# ---- submissions ---------------------------------------------------------------------------


def test_submission_rules_follow_the_track(served: str, new_key: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    with client(served, new_key(track="data")) as data:
        with pytest.raises(UnprocessableEntityError) as no_checkpoint:
            data.submit()
        assert no_checkpoint.value.param == "checkpoint"
        with pytest.raises(NotFoundError):
            data.submit(checkpoint="ckpt_not_mine")
        assert data.submissions() == []

    with client(served, new_key(track="harness")) as harness_run:
        with pytest.raises(UnprocessableEntityError) as no_harness:
            harness_run.submit()
        assert no_harness.value.param == "harness"
        harness = harness_run.evaluation.upload_harness(my_harness(tmp_path))
        with pytest.raises(UnprocessableEntityError) as kept_weights:
            harness_run.submit(checkpoint="ckpt_x", harness=harness.id)
        assert kept_weights.value.param == "checkpoint"
        submission = harness_run.submit(harness=harness.id)
        assert submission.id.startswith("sub_") and submission.track == "harness"
        assert (submission.harness, submission.model, submission.checkpoint) == (harness.id, "tiny", None)
        assert [s.id for s in harness_run.submissions()] == [submission.id]
        with pytest.raises(NotFoundError):
            harness_run.submit(harness="hrn_not_mine")

    with client(served, new_key(track="joint")) as joint:
        with pytest.raises(UnprocessableEntityError):
            joint.submit(harness="minimal")  # joint submits a checkpoint too


def test_async_twin(served: str, store: Store, new_key: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    register_directly(store)
    key = new_key(track="harness")

    async def main() -> None:
        async with AsyncGym(base_url=served, api_key=key["key"], max_retries=0) as gym:
            assert [b.name for b in await gym.evaluation.benchmarks()] == ["arithmetic"]
            harness = await gym.evaluation.upload_harness(my_harness(tmp_path))
            assert [h.id for h in await gym.evaluation.harnesses()] == [harness.id]
            with pytest.raises(NotFoundError):
                await gym.evaluation.run("nope", model="tiny")
            with pytest.raises(NotFoundError):
                await gym.evaluation.wait("evj_nope", poll_s=0)
            submission = await gym.submit(harness=harness.id)
            assert [s.id for s in await gym.submissions()] == [submission.id]

    asyncio.run(main())


# ---- the agent CLI -------------------------------------------------------------------------


def test_cli_eval_harness_and_submit(
    served: str, store: Store, new_key: Callable[..., dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_directly(store)
    key = new_key(track="harness")

    def gym(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv), client_factory=lambda: client(served, key))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = gym("eval", "benchmarks", "--json")
    assert code == 0 and [b["name"] for b in json.loads(out)] == ["arithmetic"] and "official" not in out
    code, out, _ = gym("eval", "benchmarks")
    assert code == 0 and "arithmetic" in out and "dev (60)" in out and "official" not in out

    code, out, err = gym("harness", "upload", str(my_harness(tmp_path)))
    assert code == 0 and out.strip().startswith("hrn_") and "'mine' uploaded" in err
    harness_id = out.strip()
    code, out, _ = gym("harness", "ls")
    assert code == 0 and harness_id in out and "mine" in out
    code, _, err = gym("harness", "upload", str(tmp_path / "nowhere"))
    assert code == 1 and "does not exist" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = gym("harness", "upload", str(empty))
    assert code == 1 and "harness.toml" in err

    code, _, err = gym("eval", "run", "--benchmark", "nope", "--model", "tiny")
    assert code == 1 and err.startswith("error: ") and "not found" in err
    code, _, err = gym("eval", "status", "evj_nope")
    assert code == 1 and "not found" in err
    code, out, _ = gym("eval", "ls")
    assert code == 0 and out.strip() == "no evaluation jobs"

    code, _, err = gym("submit")
    assert code == 1 and "harness" in err
    code, out, _ = gym("submit", "--harness", harness_id, "--json")
    assert code == 0 and json.loads(out)["harness"] == harness_id and json.loads(out)["track"] == "harness"


# ---- one small evaluation, end to end ------------------------------------------------------

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@needs_bwrap
def test_a_small_evaluation_end_to_end(served: str, store: Store, new_key: Callable[..., dict[str, Any]]) -> None:
    """Two tasks of the dev split with the tiny model and the minimal harness: the job runs its
    trials in sandboxes, reports progress, scores avg@1, and per-task results follow the key's detail."""
    register_directly(store)
    # The job's model-door key is minted under the run key with no inference concurrency cap,
    # which a key with a capped inference grant (every track preset) refuses; this run's policy
    # leaves inference uncapped so the end-to-end path is exercised regardless.
    policy = {"services": {"inference": {"models": "*"}, "evaluation": {"detail": "full"},
                           "sandbox": {"max_concurrency": 5}}}
    with httpx.Client(base_url=served) as c:
        r = c.post("/admin/v1/keys", json={"policy": policy, "budget_usd": 5.0}, headers=admin_headers())
        assert r.status_code == 201, r.text
        key = r.json()
    with client(served, key) as gym:
        before = gym.balance().spent_usd
        job = gym.evaluation.run("arithmetic", model="tiny", limit=2, sampling={"temperature": 0, "max_tokens": 16})
        assert job.status in ("queued", "running") and job.tasks == 2 and job.progress.total == 2
        seen: list[tuple[str, int]] = []
        final = gym.evaluation.wait(job.id, poll_s=0.5, timeout=300,
                                    on_progress=lambda j: seen.append((j.status, j.progress.done)))
        assert final.status == "succeeded", final.error
        assert final.progress.done == 2 and final.detail == "full" and 0.0 <= final.score <= 1.0
        assert seen[-1] == ("succeeded", 2) and len(seen) == len(set(seen))
        results = gym.evaluation.results(job.id)
        assert [r.task_id for r in results] == sorted(r.task_id for r in results)
        assert len(results) == 2 and all(r.attempt == 1 for r in results)
        # A trial that failed (e.g. its sandbox ended under it) has an error and no reward and counts 0;
        # that is the trial runner's business: here each result is one or the other.
        for r in results:
            assert r.error or (r.reward in (0.0, 1.0) and r.trajectory and r.trajectory.get("steps")), r
        assert final.score == pytest.approx(sum(r.reward or 0.0 for r in results) / 2)
        assert gym.balance().spent_usd > before  # trial sandboxes and tokens are the run's
        assert [j.id for j in gym.evaluation.jobs()] == [job.id]
        assert gym.evaluation.cancel(job.id).status == "succeeded"  # a finished job stays as it ended

        child = gym.keys.mint(name="aggregate-only", policy={"services": {"evaluation": {"detail": "aggregate"}}})
    with Gym(base_url=served, api_key=child.key, max_retries=0) as aggregate:
        assert aggregate.evaluation.get(job.id).detail == "aggregate"
        with pytest.raises(PermissionDeniedError):
            aggregate.evaluation.results(job.id)


@needs_bwrap
def test_cli_eval_run_wait_status_and_results(
    served: str, store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_directly(store)
    policy = {"services": {"inference": {"models": "*"}, "evaluation": {}, "sandbox": {"max_concurrency": 5}}}
    with httpx.Client(base_url=served) as c:
        key = c.post("/admin/v1/keys", json={"policy": policy, "budget_usd": 5.0}, headers=admin_headers()).json()

    def gym(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv), client_factory=lambda: client(served, key))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = gym("eval", "run", "--benchmark", "arithmetic", "--model", "tiny", "--limit", "1",
                         "--max-tokens", "16", "--temperature", "0", "--wait", "--poll", "0.2")
    assert code == 0, err
    job_id, final = out.strip().splitlines()
    assert job_id.startswith("evj_") and final.startswith(f"{job_id}: succeeded, score ")
    assert "avg@1" in final and f"{job_id}: succeeded 1/1 trials" in err
    code, out, _ = gym("eval", "status", job_id, "--json")
    status = json.loads(out)
    assert code == 0 and status["sampling"] == {"temperature": 0.0, "max_tokens": 16, "top_p": 1.0}
    code, out, err = gym("eval", "results", job_id)
    assert code == 0 and out.splitlines()[0].split() == ["TASK", "ATTEMPT", "REWARD", "ERROR"]
    assert "1 trials, mean reward" in err
    code, out, _ = gym("eval", "results", job_id, "--json")
    (result,) = json.loads(out)
    assert code == 0 and (result["error"] or result["trajectory"]["steps"])
    code, out, _ = gym("eval", "ls")
    assert code == 0 and job_id in out and "succeeded" in out


@needs_bwrap
def test_cancel_keeps_the_trials_that_finished(served: str, store: Store, new_key: Callable[..., dict[str, Any]]) -> None:
    """Results are written as each trial ends: a cancelled job keeps them, and runs no more."""
    register_directly(store)
    key = new_key()
    with client(served, key) as gym:
        job = gym.evaluation.run("arithmetic", model="tiny", limit=40, sampling={"temperature": 0, "max_tokens": 8})
        deadline = time.monotonic() + 300
        while gym.evaluation.get(job.id).progress.done < 2:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        gym.evaluation.cancel(job.id)
        final = gym.evaluation.wait(job.id, poll_s=0.5, timeout=300)
        results = gym.evaluation.results(job.id)
        assert final.status == "cancelled"
        assert 2 <= len(results) == final.progress.done < 40
        assert all(r.reward in (0.0, 1.0) or r.error for r in results)
        balance = gym.balance()
        assert balance.reserved_usd == 0 and balance.spent_usd > 0
        # the job's minted keys were revoked when it ended
        with httpx.Client(base_url=served, headers=admin_headers()) as c:
            minted = [k for k in c.get("/admin/v1/keys").json()["data"] if (k.get("name") or "").startswith(
                f"evaluation {job.id}")]
        assert minted and all(k["status"] == "revoked" for k in minted)
