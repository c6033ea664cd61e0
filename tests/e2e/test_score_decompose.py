"""``rsigym score RUN --decompose``: the 2×2 of model × harness on a run whose gain is the harness's.

The run submits a checkpoint trained for one step (weights that barely moved: the tiny model is
no better at arithmetic for it) with a harness that works the sum out itself (the model is not
asked). Scored with ``--decompose`` on a small official split with the tiny model, avg@1: the
four cells are scored on the same tasks, the weights' contribution is within noise (0 in its
interval) and the harness's is the whole gain; ``rsigym report`` carries the decomposition,
and the run's own score (not a cell) is what the RSI-Index reads."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from ops.cli.main import app as operator_cli
from rsigym import Gym
from services.models.synthetic import subtraction
from tests.conftest import ADMIN_TOKEN, create_key
from tests.fakes.live_gym import harness_archive
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
ROOT = Path(__file__).resolve().parents[2]
TASKS = 4
CALCULATOR = r"""q="$(cat "${RSIGYM_TASK_INSTRUCTION_FILE:-/task/instruction.md}")"
if [[ $q =~ ([0-9]+)\ *([-+*])\ *([0-9]+) ]]; then
  echo $(( ${BASH_REMATCH[1]} ${BASH_REMATCH[2]} ${BASH_REMATCH[3]} )) > /app/answer.txt
fi
"""


@pytest.fixture
def served(make_gym: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    gym = make_gym()
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield url
    gym.service_apps["evaluation"].state.evaluation.runner.wait_idle(timeout=120)


def rsigym(*args: str) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result


def small_arithmetic(tmp_path: Path) -> Path:
    """The bundled arithmetic benchmark cut to TASKS tasks a split (the official ones drawn at registration)."""
    src, dest = ROOT / "benchmarks" / "arithmetic", tmp_path / "arith-small"
    shutil.copytree(src, dest)
    for task in sorted((dest / "dev").iterdir())[TASKS:]:
        shutil.rmtree(task)
    toml = dest / "benchmark.toml"
    toml.write_text(toml.read_text().replace('name = "arithmetic"', 'name = "arith-small"')
                    .replace("count = 60", f"count = {TASKS}"))
    return dest


def test_harness_only_gain_is_the_harness_contribution(served: str, tmp_path: Path) -> None:
    assert rsigym("benchmarks", "register", str(small_arithmetic(tmp_path)), "--wait", "--json")["status"] == "ready"
    with httpx.Client(base_url=served) as c:
        run = create_key(c, track="joint", name="decomposed", budget_usd=5.0)
    with Gym(base_url=served, api_key=run["key"], max_retries=0) as gym:
        rng = random.Random(5)
        dataset = gym.training.upload_dataset([{"messages": subtraction(rng)} for _ in range(16)], name="one-step")
        job = gym.training.wait(gym.training.create_job(datasets=[dataset.id], base_model="tiny", steps=1,
                                                        batch_size=8, learning_rate=1e-5).id, timeout=300, poll=1)
        assert job.status == "succeeded", (job.status, job.error)
        checkpoint = job.checkpoints[-1]
        harness = gym.evaluation.upload_harness(harness_archive("calculator", CALCULATOR))
        gym.submit(checkpoint=checkpoint, harness=harness.id)

    out = rsigym("score", run["id"], "--attempts", "1", "--decompose", "--wait", "--json")
    cells = {r.get("cell") for r in out["data"] if r["run_id"] == run["id"]}
    assert cells == {None, "model", "harness"}, out["data"]
    (view,) = out["decomposition"]
    print("\n" + json.dumps({k: view[k] for k in ("cells", "gain", "contributions")}, indent=1))
    assert view["status"] == "complete" and view["tasks"] == TASKS and view["benchmark"] == "arith-small"
    assert {n: (c["model"], c["harness"]) for n, c in view["cells"].items()} == {
        "initial": ("tiny", "minimal"), "model": (checkpoint, "minimal"),
        "harness": ("tiny", harness.id), "submitted": (checkpoint, harness.id)}
    assert view["cells"]["harness"]["score"] == view["cells"]["submitted"]["score"] == 1.0  # the calculator's
    gain, c = view["gain"], view["contributions"]
    assert not gain["within_noise"] and gain["estimate"] > 0.5
    assert c["weights"]["within_noise"] and c["weights"]["ci95"][0] <= 0.0 <= c["weights"]["ci95"][1]
    assert not c["harness"]["within_noise"]
    assert c["harness"]["estimate"] == pytest.approx(gain["estimate"] - c["weights"]["estimate"])
    assert abs(c["weights"]["estimate"]) <= 1 / TASKS  # the weights' part is at most one task's noise

    report = rsigym("report", "--out", str(tmp_path / "report"), "--json")
    (row,) = report["runs"]
    assert row["benchmarks"][0]["submitted"] == view["cells"]["submitted"]["score"]  # the run's score, not a cell
    assert row["decomposition"][0]["contributions"] == c
