"""Harbor's view of a task, built once per content (services/evaluation/task_views.py).

What could go wrong when a trial reuses what an earlier trial computed: a lock or checksum that
is not what Harbor would write, a task edited between two trials still seen as it was, one
trial's change to its task (the trial sets the verifier's mode) reaching another. Each is played
here on a copy of a bundled task; nothing runs in a sandbox (a trial is built, not run).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from harbor.models.job.lock import build_trial_lock
from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import VerifierEnvironmentMode
from harbor.trial.trial import Trial

from services.evaluation import task_views
from services.evaluation.benchmarks import _task_ref
from services.evaluation.trials import TrialRequest, build_trial_config, create_trial

ROOT = Path(__file__).resolve().parents[4]
TASK = ROOT / "benchmarks" / "arithmetic" / "dev" / "sub-0001"
HARNESS = ROOT / "agent_container" / "harness" / "minimal"


@pytest.fixture(autouse=True)
def _no_views() -> None:
    task_views.clear()


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(TASK, tmp_path / "task"))


def _request(task_dir: Path, trials: Path, agent: str, **extra: object) -> TrialRequest:
    return TrialRequest(task=_task_ref(task_dir), harness_dir=HARNESS if agent == "harness" else None,
                        gateway_url="http://127.0.0.1:9", sandbox_key="k", door_key="d",
                        model="teacher" if agent == "harness" else None, sampling={"temperature": 0.5},
                        attempt=1, trials_dir=trials, agent=agent, **extra)  # type: ignore[arg-type]


def _trial(req: TrialRequest, name: str) -> Trial:
    trial = asyncio.run(create_trial(build_trial_config(req, name)))
    trial._close_logger_handler()
    return trial


def _harbor_checksum(task_dir: Path) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return Task(task_dir).checksum


def _harbor_lock(trial: Trial) -> dict[str, object]:
    """What Harbor's own ``build_trial_lock`` writes for this trial's config."""
    lock = build_trial_lock(trial_config=trial.config, task_download_result=trial._task_download_result)
    return json.loads(lock.model_dump_json(exclude_none=True))


@pytest.mark.parametrize("agent", ["oracle", "nop", "harness"])
def test_a_trial_from_a_view_writes_what_harbor_would(task_dir: Path, tmp_path: Path, agent: str) -> None:
    req = _request(task_dir, tmp_path / "trials", agent, agent_timeout_s=33.0, verifier_timeout_s=44.0)
    first, second = _trial(req, "t1"), _trial(req, "t2")  # the second from the first's view
    for trial in (first, second):
        assert isinstance(trial._view, task_views.TaskView)
        assert json.loads(trial.paths.lock_path.read_text()) == _harbor_lock(trial)
        trial._init_result()
        assert trial.result.task_checksum == _harbor_checksum(task_dir)
        assert trial.task.instruction == Task(task_dir).instruction
    assert second._view is first._view


def test_a_task_edited_between_trials_gets_a_fresh_view(task_dir: Path, tmp_path: Path) -> None:
    req = _request(task_dir, tmp_path / "trials", "oracle")
    before = _trial(req, "t1")
    (task_dir / "instruction.md").write_text("A different question.\n")
    (task_dir / "tests" / "test.sh").chmod(0o700)  # a mode alone changes the content too
    after = _trial(req, "t2")
    assert after._view is not before._view
    assert after.task.instruction.strip() == "A different question."
    lock = json.loads(after.paths.lock_path.read_text())
    assert lock == _harbor_lock(after)
    assert lock["task"]["digest"] != json.loads(before.paths.lock_path.read_text())["task"]["digest"]
    after._init_result()
    assert after.result.task_checksum == _harbor_checksum(task_dir)


def test_a_trial_changes_its_own_copy_of_the_task(task_dir: Path, tmp_path: Path) -> None:
    req = _request(task_dir, tmp_path / "trials", "nop")
    first, second = _trial(req, "t1"), _trial(req, "t2")
    # create_trial puts the verifier in a separate environment, whatever task.toml says
    assert first.task.config.verifier.environment_mode == VerifierEnvironmentMode.SEPARATE
    assert first.task is not second.task and first.task.config is not second.task.config
    first.task.config.verifier.env["LEAKED"] = "1"
    first.task.extra_instructions.append("leaked")
    assert "LEAKED" not in second.task.config.verifier.env and second.task.extra_instructions == []
    third = _trial(req, "t3")
    assert "LEAKED" not in third.task.config.verifier.env and third.task.extra_instructions == []
    assert third.task.instruction == Task(task_dir).instruction


def test_a_config_the_view_does_not_reproduce_takes_harbors_path(task_dir: Path, tmp_path: Path) -> None:
    config = build_trial_config(_request(task_dir, tmp_path / "trials", "oracle"), "t1")
    config.extra_instructions = ["Answer in French."]
    assert not task_views.cacheable(config)
    trial = asyncio.run(create_trial(config))
    trial._close_logger_handler()
    assert trial._view is None
    assert trial.task.instruction.rstrip().endswith("Answer in French.")
    assert json.loads(trial.paths.lock_path.read_text()) == _harbor_lock(trial)


def test_the_content_digest_sees_names_modes_bytes_and_links(tmp_path: Path) -> None:
    root = tmp_path / "t"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"x")
    seen = {task_views.content_digest(root)}
    for change in (lambda: (root / "d" / "f").write_bytes(b"y"), lambda: (root / "d" / "f").chmod(0o755),
                   lambda: (root / "d" / "f").rename(root / "d" / "g"), lambda: (root / "e").mkdir(),
                   lambda: (root / "l").symlink_to("d"), lambda: ((root / "l").unlink(), (root / "l").symlink_to("e"))):
        change()
        digest = task_views.content_digest(root)
        assert digest not in seen
        seen.add(digest)


def test_the_views_paths_and_filter_answer_as_harbors_and_keep_no_failure(task_dir: Path, tmp_path: Path) -> None:
    """The view's ``TaskPaths`` and ``TaskFileFilter`` remember answers (the verifier asks the same
    on every trial): each answer is Harbor's own, under the task's ``.harborignore``, and a check
    that failed fails again when asked again."""
    tests = task_dir / "tests"
    (tests / "notes.md").write_text("for task authors\n")
    (tests / ".harborignore").write_text("notes.md\n")
    view_task = asyncio.run(task_views.load(_trial(_request(task_dir, tmp_path / "t", "nop"), "a").config))[0]
    harbor = Task(task_dir)
    for _ in range(2):  # the first answer computed, the second remembered
        assert view_task.file_filter.select(tests) == harbor.file_filter.select(tests)
        assert view_task.file_filter.is_excluded(tests / "notes.md") is True
        assert view_task.file_filter.is_excluded(tests / "test.sh") is False
        view_task.paths.validate_input_tree(tests, exclude=view_task.file_filter.is_excluded)
    assert (tests / "notes.md") not in [tests / p for p in view_task.file_filter.select(tests).relative_paths]

    # A tree Harbor refuses (one the view's build never checked: a view is one content, and what
    # its build checked stays checked — a changed directory is a new view, see the test above)
    (task_dir / "environment" / "more").mkdir()
    (task_dir / "environment" / "more" / "escape").symlink_to("/etc/passwd")
    for _ in range(2):
        with pytest.raises(ValueError):
            view_task.paths.validate_input_tree(task_dir / "environment" / "more")


@pytest.mark.parametrize("where", ["tests", "solution"])
def test_a_task_harbor_refuses_is_refused_by_its_view_too(task_dir: Path, tmp_path: Path, where: str) -> None:
    """The view's paths and filter remember from inside ``Task.__init__``; a check that fails
    there still fails the build, as Harbor's own ``Task`` fails, and no view is kept."""
    (task_dir / where / "escape").symlink_to("/etc/passwd")
    with pytest.raises(ValueError) as harbor:
        Task(task_dir)
    config = _trial_config(task_dir, tmp_path)
    for _ in range(2):
        with pytest.raises(ValueError) as view:
            asyncio.run(task_views.load(config))
        assert str(view.value) == str(harbor.value)


def _trial_config(task_dir: Path, tmp_path: Path) -> Any:
    return build_trial_config(_request(task_dir, tmp_path / "t", "nop"), "a")
