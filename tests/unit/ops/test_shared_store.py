"""Distributed mode runs on one shared store: a part started without RSIGYM_STORE_URL would open
SQLite in its own data dir and run as a gym apart (a split brain), so it refuses to start and says
why; the rollout service, kept off the store by design, starts and says where its records go."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.settings import StoreSettings
from ops.builder import require_shared_store

ROOT = Path(__file__).resolve().parents[3]


def _rsigym(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}
    env |= {"RSIGYM_DATA_DIR": str(tmp_path / "data"), "RSIGYM_INTERNAL_SECRET": "shared",
            "RSIGYM_GATEWAY_URL": "http://127.0.0.1:9", "RSIGYM_ADMIN_TOKEN": "rsa-test"}
    return subprocess.run([sys.executable, "-m", "ops.cli.main", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args", [("serve", "records", "--port", "9"), ("serve", "gateway", "--port", "9"),
                                  ("worker",)])
def test_a_part_without_the_shared_store_refuses_to_start(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = _rsigym(tmp_path, *args)
    assert done.returncode != 0
    assert "needs RSIGYM_STORE_URL" in done.stderr and "rsigym up" in done.stderr, done.stderr
    assert not list((tmp_path / "data").glob("gym.sqlite3*")), "it opened a SQLite store of its own"


def test_rollout_is_kept_off_the_store_and_says_where_its_records_go() -> None:
    warning = require_shared_store(StoreSettings(url=None), "rollout")
    assert warning is not None and "SQLite" in warning
    assert require_shared_store(StoreSettings(url="postgresql://db/gym"), "records") is None
