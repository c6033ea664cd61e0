"""Scenario 5: the disk fills up while the gym writes a checkpoint and while it stores an uploaded
harness. The gym's checkpoint and harness directories are each a small tmpfs (``mount -t
tmpfs``, so this needs root or CAP_SYS_ADMIN; skipped otherwise) filled to the last byte, so the
real write fails with ENOSPC where it would in production.

* Harness upload: refused in the standard shape (``503 service_unavailable``, "storage is
  full"), nothing charged, nothing left on the full disk (no half-written archive or tree).
* Checkpoint write at the end of a training job: the job ends ``failed`` with that reason, its
  steps are billed and nothing is held, no half-written checkpoint directory is left, no
  checkpoint is registered.

Once space is back both succeed — the gym was not left in a bad state.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rsigym
from tests.conftest import bearer, client_for, create_key
from tests.fakes.live_gym import harness_archive
from tests.fakes.servers import serve_gym
from tests.faults.conftest import assert_ledger_sound

ROWS = [{"messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": str(i + 1)}]}
        for i in range(16)]


@contextlib.contextmanager
def full_disk(path: Path) -> Iterator[Path]:
    """``path`` becomes a 1 MiB tmpfs holding one file that takes all of its space; yields that file
    (delete it to give the space back)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    filler = path / "filler"
    try:
        with open(filler, "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError as err:
                assert err.errno == errno.ENOSPC
        yield filler
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _left_on_disk(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name not in ("filler", "lost+found"))


def test_harness_upload_on_a_full_disk(make_gym: Any) -> None:
    gym = make_gym()
    client = client_for(gym)
    key = create_key(client, 1.0)
    harnesses = gym.gateway.context.data_dir / "evaluation" / "harnesses"
    archive = harness_archive("tiny", "echo 0\n")
    with full_disk(harnesses) as filler:
        refused = client.post("/evaluation/v1/harnesses", content=archive, headers={
            **bearer(key["key"]), "Content-Type": "application/gzip"})
        assert refused.status_code == 503, refused.text
        body = refused.json()
        assert body["type"] == "error" and body["error"]["type"] == "service_unavailable", body
        assert "storage is full" in body["error"]["message"]
        assert _left_on_disk(harnesses) == []  # no half-written archive, no half-unpacked tree
        assert client.get("/evaluation/v1/harnesses", headers=bearer(key["key"])).json()["data"] == []
        f = assert_ledger_sound(gym.gateway.store, key["id"])
        assert f["spent_nusd"] == 0, f  # nothing charged for the failed upload
        filler.unlink()
        stored = client.post("/evaluation/v1/harnesses", content=archive, headers={
            **bearer(key["key"]), "Content-Type": "application/gzip"})
        assert stored.status_code == 201, stored.text
        assert len(client.get("/evaluation/v1/harnesses", headers=bearer(key["key"])).json()["data"]) == 1
    assert_ledger_sound(gym.gateway.store, key["id"])


def test_checkpoint_write_on_a_full_disk(make_gym: Any) -> None:
    gym = make_gym()
    checkpoints = gym.gateway.context.data_dir / "checkpoints"
    with serve_gym(gym) as url:
        client = client_for(gym)
        key = create_key(client, 1.0)
        sdk = rsigym.Gym(base_url=url, api_key=key["key"], timeout=120)
        dataset = sdk.training.upload_dataset(ROWS, name="plus-one")
        with full_disk(checkpoints) as filler:
            job = sdk.training.create_job(datasets=[dataset.id], base_model="tiny", steps=2, batch_size=2,
                                          max_length=32, seed=1)
            failed = sdk.training.wait(job.id, timeout=300, poll=0.5)
            assert failed.status == "failed", failed
            assert "storage is full" in (failed.error or ""), failed.error
            assert _left_on_disk(checkpoints) == []  # no half-written checkpoint
            assert list(sdk.training.checkpoints()) == []
            f = assert_ledger_sound(gym.gateway.store, key["id"])
            assert f["rows"].get("settled", 0) >= 2 and f["spent_nusd"] > 0, f  # the steps done are billed
            filler.unlink()
            ok = sdk.training.wait(sdk.training.create_job(datasets=[dataset.id], base_model="tiny", steps=2,
                                                           batch_size=2, max_length=32, seed=1).id, timeout=300, poll=0.5)
            assert ok.status == "succeeded", ok
            assert len(list(sdk.training.checkpoints())) == 1
            shutil.rmtree(checkpoints / next(iter(_left_on_disk(checkpoints))))  # before the tmpfs goes
        assert_ledger_sound(gym.gateway.store, key["id"])
    assert os.path.isdir(checkpoints)
