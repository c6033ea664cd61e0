"""Disk is metered and bounded (issue 13, item 5): a run's datasets and harnesses count against
its storage quota at their stored (expanded) size, a refused upload leaves nothing on disk and
charges nothing, and a sandbox's writes past its template's ``disk_mb`` fail with ENOSPC inside
it without touching the host's disk."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from billing.storage_quota import StorageQuota
from kit.config import GymConfig, SandboxTemplate, StorageConfig
from kit.errors import PayloadTooLarge, QuotaExceeded
from kit.ids import new_id
from ops.builder import Gym
from services.evaluation.tables import EvaluationJob, TrialResultRow
from services.evaluation.trials import TrialOutcome
from storage.store import Store
from tests.conftest import admin_headers, bearer, client_for, create_key, gym_config
from tests.fakes.servers import serve_gym

MiB = 2**20
MANIFEST = b'[harness]\nname = "bomb"\nrun = "python main.py"\n'


def _archive(files: dict[str, bytes]) -> bytes:
    """A .tar.gz holding harness.toml and ``files``: zeros compress ~1000:1, so a few dozen KiB
    of upload unpack to tens of MiB."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        for name, data in {"harness.toml": MANIFEST, **files}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _config(standin: tuple[str, Any], *, quota_mb: int = 4096, max_object_mb: int = 1024,
            max_dataset_bytes: int | None = None, disk_mb: int | None = None) -> GymConfig:
    config = gym_config(standin[0])
    config.storage = StorageConfig(run_quota_mb=quota_mb, max_object_mb=max_object_mb)
    if max_dataset_bytes is not None:
        config.training.max_dataset_bytes = max_dataset_bytes
    if disk_mb is not None:
        config.sandbox.templates = [SandboxTemplate(name="base", disk_mb=disk_mb)]
    return config


def _files(root: Path) -> list[str]:
    """Everything under ``root`` (an upload's leftovers would show here)."""
    return sorted(str(Path(d, n).relative_to(root)) for d, dirs, files in os.walk(root) for n in dirs + files) \
        if root.exists() else []


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body["type"] == "error" and body["request_id"], body  # the standard shape
    return dict(body["error"])


def _balance(client: Any, key: str) -> dict[str, Any]:
    response = client.get("/v1/balance", headers=bearer(key))
    assert response.status_code == 200, response.text
    return dict(response.json())


def _harness_root(gym: Gym) -> Path:
    return Path(gym.gateway.context.settings.data_dir) / "evaluation" / "harnesses"


def test_a_harness_that_unpacks_past_the_quota_is_refused_with_nothing_left_or_charged(
        make_gym: Callable[..., Gym], standin: tuple[str, Any]) -> None:
    gym = make_gym(config=_config(standin, quota_mb=32))
    client = client_for(gym)
    key = create_key(client, budget_usd=1.0)["key"]
    bomb = _archive({"blob.bin": bytes(48 * MiB)})
    assert len(bomb) < 256 * 1024  # a small upload ...
    before = _files(_harness_root(gym))

    response = client.post("/evaluation/v1/harnesses", content=bomb, headers=bearer(key))

    assert response.status_code == 403, response.text  # ... that would unpack to 48 MiB of a 32 MiB quota
    error = _error(response)
    assert error["type"] == "quota_exceeded" and "storage quota" in error["message"]
    assert _files(_harness_root(gym)) == before  # no tree, no archive, no partial directory, no temp file
    assert client.get("/evaluation/v1/harnesses", headers=bearer(key)).json()["data"] == []
    balance = _balance(client, key)
    assert balance["storage"]["used_bytes"] == 0 and balance["storage"]["objects"] == 0
    assert balance["spent_usd"] == 0

    # one object past the per-object limit is a 413, whatever the quota has left
    big = make_gym(config=_config(standin, quota_mb=4096, max_object_mb=16))
    big_client = client_for(big)
    big_key = create_key(big_client, budget_usd=1.0)["key"]
    response = big_client.post("/evaluation/v1/harnesses", content=bomb, headers=bearer(big_key))
    assert response.status_code == 413, response.text
    assert _error(response)["type"] == "payload_too_large"
    assert _files(_harness_root(big)) == []
    assert _balance(big_client, big_key)["storage"]["used_bytes"] == 0


def test_a_second_harness_past_the_run_quota_is_refused(make_gym: Callable[..., Gym], standin: tuple[str, Any]) -> None:
    gym = make_gym(config=_config(standin, quota_mb=32))
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0)
    key = run["key"]
    first, second = _archive({"a.bin": bytes(20 * MiB)}), _archive({"b.bin": bytes(20 * MiB)})

    ok = client.post("/evaluation/v1/harnesses", content=first, headers=bearer(key))
    assert ok.status_code == 201, ok.text
    used = _balance(client, key)["storage"]
    # the expanded tree is what counts (20 MiB), not the ~20 KiB that were uploaded
    assert used["used_bytes"] >= 20 * MiB and used["by_kind"]["harnesses"] == used["used_bytes"]
    assert used["quota_bytes"] == 32 * MiB and used["objects"] == 1
    on_disk = _files(_harness_root(gym))

    refused = client.post("/evaluation/v1/harnesses", content=second, headers=bearer(key))
    assert refused.status_code == 403, refused.text
    assert _error(refused)["type"] == "quota_exceeded"
    assert _files(_harness_root(gym)) == on_disk  # the second one's tree never appeared
    assert [h["id"] for h in client.get("/evaluation/v1/harnesses", headers=bearer(key)).json()["data"]] \
        == [ok.json()["id"]]
    assert _balance(client, key)["storage"] == used
    # the operator sees the same (the admin key view, which `rsigym watch` shows)
    assert client.get(f"/admin/v1/keys/{run['id']}", headers=admin_headers()).json()["storage"] == used

    again = client.post("/evaluation/v1/harnesses", content=first, headers=bearer(key))
    assert again.status_code == 201 and again.json()["id"] == ok.json()["id"]  # the same record, not charged twice
    assert _balance(client, key)["storage"] == used

    # another run has its own quota: the same bytes are stored once on disk, charged to it as well
    other = create_key(client, budget_usd=1.0)["key"]
    theirs = client.post("/evaluation/v1/harnesses", content=first, headers=bearer(other))
    assert theirs.status_code == 201, theirs.text
    assert _balance(client, other)["storage"]["used_bytes"] == used["used_bytes"]


def _dataset(rows: int, tag: str) -> bytes:
    line = {"prompt": f"{tag} " + "x" * 200, "completion": "y" * 200}
    return b"".join(json.dumps({**line, "prompt": f"{line['prompt']} {i}"}).encode() + b"\n" for i in range(rows))


def test_datasets_past_the_run_quota_are_refused(make_gym: Callable[..., Gym], standin: tuple[str, Any]) -> None:
    gym = make_gym(config=_config(standin, quota_mb=1, max_dataset_bytes=900 * 1024))
    client = client_for(gym)
    key = create_key(client, budget_usd=1.0)["key"]
    root = Path(gym.gateway.context.settings.data_dir) / "datasets"
    first, second = _dataset(1300, "first"), _dataset(1300, "second")  # ~550 KiB each: one fits, not two

    ok = client.post("/training/v1/datasets", content=first, headers=bearer(key))
    assert ok.status_code == 201, ok.text
    storage = _balance(client, key)["storage"]
    assert storage["by_kind"]["datasets"] == storage["used_bytes"] == len(first)
    on_disk = _files(root)

    refused = client.post("/training/v1/datasets", content=second, headers=bearer(key))
    assert refused.status_code == 403, refused.text
    assert _error(refused)["type"] == "quota_exceeded"
    assert _files(root) == on_disk  # the refused content is not stored anywhere
    assert [d["id"] for d in client.get("/training/v1/datasets", headers=bearer(key)).json()["data"]] \
        == [ok.json()["id"]]
    assert _balance(client, key)["storage"] == storage

    # one dataset over the per-dataset limit: 413 before anything is read into the store
    huge = _dataset(2300, "huge")
    assert len(huge) > 900 * 1024
    response = client.post("/training/v1/datasets", content=huge, headers=bearer(key))
    assert response.status_code == 413, response.text
    assert _error(response)["type"] == "payload_too_large"
    assert _files(root) == on_disk


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_sandbox_writes_past_disk_mb_fail_inside(make_gym: Callable[..., Gym], standin: tuple[str, Any]) -> None:
    from e2b import Sandbox

    gym = make_gym(config=_config(standin, disk_mb=16))
    backend = gym.service_apps["sandbox"].state.sandbox.backend
    host_root = Path(backend.root)
    with serve_gym(gym) as url, httpx.Client(base_url=url) as client:
        key = create_key(client, budget_usd=1.0)["key"]
        sbx = Sandbox.create(template="base", timeout=120, api_key=key, api_url=f"{url}/sandbox",
                             sandbox_url=f"{url}/sandbox/envd")
        try:
            r = sbx.commands.run("df -B1 --output=size / | tail -1")
            assert int(r.stdout.strip()) == 16 * MiB, r.stdout  # the filesystem itself is disk_mb big
            r = sbx.commands.run("dd if=/dev/zero of=/home/user/fill bs=1M count=40 2>&1; echo rc=$?",
                                 timeout=60, request_timeout=70)
            assert "No space left on device" in r.stdout and "rc=0" not in r.stdout, r.stdout
            # the limit is the sandbox's whole writable filesystem, not one directory of it
            r = sbx.commands.run("dd if=/dev/zero of=/tmp/more bs=1M count=4 2>&1; echo rc=$?; "
                                 "stat -c %s /home/user/fill", timeout=60, request_timeout=70)
            assert "No space left on device" in r.stdout and "rc=0" not in r.stdout, r.stdout
            assert int(r.stdout.split()[-1]) <= 16 * MiB
            # none of it landed on the host's disk: nothing big under the sandbox's host dir
            assert all(p.stat().st_size < MiB for p in host_root.rglob("*") if p.is_file() and not p.is_symlink())
            # the sandbox still works once it is full: freeing space makes room again
            r = sbx.commands.run("rm /home/user/fill && echo ok > /home/user/small && cat /home/user/small")
            assert r.stdout.strip() == "ok"
        finally:
            sbx.kill()



def test_trial_trajectories_count_and_past_the_quota_only_the_reward_is_kept(
        make_gym: Callable[..., Gym], standin: tuple[str, Any], tmp_path: Path) -> None:
    gym = make_gym(config=_config(standin, quota_mb=2))
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0)
    store = gym.gateway.store
    runner = gym.service_apps["evaluation"].state.evaluation.runner
    job_id = new_id("evj")
    with store.transaction() as s:
        s.add(EvaluationJob(id=job_id, run_id=run["id"], key_id=run["id"], purpose="agent", benchmark="b", split="dev",
                            model="tiny", harness="minimal", attempts=2, sampling={}, task_ids=["t1"],
                            gateway_url="http://x", status="running", trials_total=2, trials_done=0))

    def outcome(attempt: int, trajectory_mb: float) -> TrialOutcome:
        trial = tmp_path / f"trial-{attempt}"
        trial.mkdir()
        (trial / "result.json").write_text("{}")
        steps = [{"message": "x" * 1024}] * int(trajectory_mb * 1024)
        return TrialOutcome(task_id="t1", attempt=attempt, reward=1.0, trajectory={"steps": steps},
                            verifier_output="ok", agent_output="done", error=None, sandbox_id=None,
                            started_at="2026-12-01T00:00:00Z", finished_at="2026-12-01T00:00:01Z",
                            result_path=str(trial / "result.json"))

    runner._record(job_id, outcome(0, 1.2), 0)  # fits in 2 MiB
    storage = _balance(client, run["key"])["storage"]
    assert storage["by_kind"]["trajectories"] > MiB and storage["by_kind"]["results"] > 0
    runner._record(job_id, outcome(1, 1.2), 1)  # does not: recorded, reward kept, trajectory not
    assert _balance(client, run["key"])["storage"] == storage
    with store.transaction() as s:
        rows = {r.attempt: r for r in s.scalars(select(TrialResultRow).where(TrialResultRow.job_id == job_id))}
    assert rows[0].trajectory is not None and rows[1].trajectory is None
    assert rows[0].reward == rows[1].reward == 1.0
    assert "storage quota" in rows[1].agent_output
    assert not (tmp_path / "trial-1").exists() and (tmp_path / "trial-0").exists()


def test_concurrent_writes_never_pass_the_quota_together(store: Store) -> None:
    """The charge is one conditional UPDATE: on SQLite and PostgreSQL alike, of eight writers
    racing for a quota that holds four, exactly four are stored."""
    quota = StorageQuota(store, quota_bytes=4 * MiB, max_object_bytes=MiB)
    barrier = threading.Barrier(8)

    def write(_: int) -> bool:
        barrier.wait()
        try:
            with store.transaction() as s:
                quota.charge(s, "run_race", "datasets", MiB)
            return True
        except QuotaExceeded:
            return False

    with ThreadPoolExecutor(8) as pool:
        stored = list(pool.map(write, range(8)))
    assert stored.count(True) == 4
    usage = quota.usage("run_race")
    assert usage["used_bytes"] == usage["by_kind"]["datasets"] == 4 * MiB and usage["objects"] == 4
    with pytest.raises(PayloadTooLarge):
        quota.check_object("datasets", MiB + 1)
