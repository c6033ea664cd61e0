"""The operator CLI finds its gym, and says how when it cannot (issue 16, item 4).

The usual first-hour mistake: the gym was started with ``--data-dir A``, the operator's other shell
has no ``RSIGYM_DATA_DIR``, and ``rsigym keys list`` fails — with no token where it looked, or with a
401 from a stale token of an earlier gym. Both errors now name the data dir the gym at that URL was
started with. Played with the real ``rsigym up`` and the real CLI, each a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODELS_DIR
from tests.fakes.servers import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gym_up(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, str]]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}
    env = {**base, "XDG_CACHE_HOME": str(tmp_path / "cache"), "RSIGYM_MODELS_DIR": str(MODELS_DIR),
           "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    data, port = tmp_path / "started-here", free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "gym.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ops.cli.main", "up", "--data-dir", str(data),
                                 "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_healthy(proc, url, tmp_path / "gym.log")
        yield url, data, env
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert list((tmp_path / "cache" / "rsigym" / "gyms").glob("*.json")) == []  # the note went with the gym


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ops.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_the_cli_names_the_data_dir_its_gym_was_started_with(gym_up: tuple[str, Path, dict[str, str]],
                                                             tmp_path: Path) -> None:
    url, data, env = gym_up
    # another shell: the right URL, no data dir (the default one holds no token)
    elsewhere = {**env, "RSIGYM_URL": url, "RSIGYM_DATA_DIR": str(tmp_path / "empty")}
    done = _cli(elsewhere, "keys", "list")
    said = " ".join((done.stderr + done.stdout).split())
    assert done.returncode != 0 and f"started with data dir {data.resolve()}" in said, said
    assert f"RSIGYM_DATA_DIR={data.resolve()}" in said and "Traceback" not in said
    # a stale token of an earlier gym: refused (401), and the same hint
    stale = tmp_path / "earlier"
    stale.mkdir()
    (stale / "admin-token").write_text("rsa-an-earlier-gyms-token")
    done = _cli({**elsewhere, "RSIGYM_DATA_DIR": str(stale)}, "keys", "list")
    said = " ".join((done.stderr + done.stdout).split())
    assert done.returncode == 1 and "authentication" in said, said
    assert f"started with data dir {data.resolve()}" in said, said
    print("\n" + said)
    assert "rsa-an-earlier-gyms-token" not in said
    # pointed at the gym's data dir, as the hint says: it works
    done = _cli({**elsewhere, "RSIGYM_DATA_DIR": str(data)}, "keys", "list", "--json")
    assert done.returncode == 0, done.stderr


def test_a_gym_started_without_a_config_works_offline(gym_up: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:
    """The README's `rsigym up` line (no --config): a run key, then the catalogue's teacher answers
    with no provider key and no network, and the gym warned about no missing key."""
    url, data, env = gym_up
    here = {**env, "RSIGYM_URL": url, "RSIGYM_DATA_DIR": str(data)}
    done = _cli(here, "keys", "create", "--track", "joint", "--budget", "5", "--json")
    assert done.returncode == 0, done.stderr
    key = json.loads(done.stdout)["key"]
    answered = httpx.post(f"{url}/rollout/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                          json={"model": "teacher", "messages": [{"role": "user", "content": "What is 20 + 22?"}]})
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "42"
    log = (tmp_path / "gym.log").read_text()
    assert "is not set" not in log and "Traceback" not in log, log[-2000:]
