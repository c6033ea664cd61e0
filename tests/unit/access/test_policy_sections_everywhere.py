"""A misspelt service in a policy (``[services.rolout]``) is refused on every path a policy enters,
by the one validation (access/policy.py), naming the bad name and the allowed ones: the CLI's
``--policy-file`` (``keys create``, ``keys policy``) before anything is sent, a task's overrides, a
preset. The admin API's and a key's own child keys': tests/unit/access/test_policy_knobs.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from access import presets
from kit.config import GymConfig
from kit.errors import Unprocessable
from kit.file_errors import FileError
from ops.cli import keys
from ops.cli.main import app
from ops.tasks import TASKS, list_tasks

ALLOWED = "the sections are agent, evaluation, inference, records, rollout, sandbox, training"


@pytest.mark.parametrize("suffix", [".toml", ".json"])
@pytest.mark.parametrize("argv", [["keys", "create", "--budget", "1", "--policy-file"], ["keys", "policy", "k_1"]])
def test_the_cli_refuses_a_misspelt_service_before_sending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          argv: list[str], suffix: str) -> None:
    sent: list[Any] = []
    monkeypatch.setattr(keys, "admin_request", lambda *a, **kw: sent.append((a, kw)) or {})
    policy = tmp_path / f"policy{suffix}"
    policy.write_text('{"services": {"rolout": {"max_concurrency": 2}}}' if suffix == ".json"
                      else "[services.rolout]\nmax_concurrency = 2\n")
    result = CliRunner().invoke(app, [*argv, str(policy)])
    assert isinstance(result.exception, FileError), result.output  # main() prints it and exits 2
    assert str(result.exception) == f"policy file {policy}: services.rolout: unknown policy section 'rolout'; {ALLOWED}."
    assert sent == []


def test_a_task_file_refuses_a_misspelt_service(tmp_path: Path) -> None:
    shutil.copytree(TASKS / "_shared", tmp_path / "_shared")
    directory = Path(shutil.copytree(TASKS / "data-arithmetic", tmp_path / "data-arithmetic"))
    (directory / "task.toml").write_text((directory / "task.toml").read_text()
                                         + "\n[preset.overrides.services.rolout]\nmax_concurrency = 1\n")
    with pytest.raises(Unprocessable) as err:
        list_tasks(tmp_path)
    assert err.value.status == 422 and err.value.param == "preset.overrides.services.rolout"
    assert f"unknown policy section 'rolout'; {ALLOWED}" in err.value.message


def test_a_preset_refuses_a_misspelt_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(presets, "_raw", lambda name: {"policy": {"services": {"rolout": {}}}})
    with pytest.raises(Unprocessable) as err:
        presets.preset_policy("data", GymConfig())
    assert err.value.param == "policy.services.rolout"
    assert f"unknown policy section 'rolout'; {ALLOWED}" in err.value.message
