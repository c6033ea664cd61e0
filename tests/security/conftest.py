"""One live gym for the security tests that run real evaluations (trials, scoring, doors):
served on a loopback port, with a small benchmark registered and validated once."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.fakes.live_gym import LiveGym, live_gym, mini_benchmark


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGym]:
    """The benchmark ``mini`` keeps Harbor's default (shared) verifier mode in its task.toml, so
    what tests prove about verification is the gym's own rule, not the task author's care."""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    with live_gym(tmp_path_factory.mktemp("gym")) as served:
        row = served.register(mini_benchmark(tmp_path_factory.mktemp("bench"), name="mini", shared_verifier=True))
        assert row["status"] == "ready", row  # oracle 1, empty 0: validation verifies in a fresh sandbox too
        yield served
