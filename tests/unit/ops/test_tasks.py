"""Tasks (ops/tasks.py, ``rsigym tasks``): the shipped tasks load and render from the
policy the run key really gets; a bad task.toml is refused naming the file and field; a task
cannot widen its track's preset."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from access.presets import preset_policy
from kit.config import GymConfig, RolloutModel
from kit.errors import Unprocessable
from ops.cli.main import app
from ops.tasks import TASKS, find_task, key_body, list_tasks, render_instruction, task_policy

BENCHMARKS = TASKS.parent / "benchmarks"


def _config() -> GymConfig:
    teachers = [RolloutModel(name=n, litellm_model=f"openai/{n}", input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
                for n in ("teacher-a", "teacher-b")]
    return GymConfig.model_validate({"rollout": {"models": [t.model_dump() for t in teachers]}})


def _copy(tmp_path: Path, name: str) -> Path:
    shutil.copytree(TASKS / "_shared", tmp_path / "_shared")
    return Path(shutil.copytree(TASKS / name, tmp_path / name))


def _edit(directory: Path, old: str, new: str) -> None:
    text = (directory / "task.toml").read_text()
    assert old in text
    (directory / "task.toml").write_text(text.replace(old, new))


def test_every_shipped_task_loads_and_renders() -> None:
    config = _config()
    tasks = list_tasks()
    assert {t.name for t in tasks} >= {"data-arithmetic", "harness-arithmetic", "joint-arithmetic",
                                       "joint-arithmetic-offline", "joint-shell"}
    for task in tasks:
        for bench in task.task.benchmarks:
            assert (BENCHMARKS / bench / "benchmark.toml").is_file(), f"{task.name}: no bundled benchmark {bench}"
        text = render_instruction(task, config)
        assert task.task.description in text
        assert task.limits.wall_clock in text
        for artifact in ("checkpoint", "harness"):
            needed = artifact in {"data": ["checkpoint"], "harness": ["harness"], "joint": ["checkpoint", "harness"]}[
                task.task.track]
            assert (f"**{artifact}**" in text.split("## Submission")[1]) == needed, task.name
        for service in task_policy(task, config).services:
            if service != "agent":  # the agent route's rate limit, not a granted service
                assert f"agent_container/skills/{service}.md" in text
        body = key_body(task, config)
        assert body["track"] == task.task.track and body["offline"] == task.task.offline
        assert body["deadline_s"] == task.limits.wall_clock_s
        assert body["agent_budget_usd"] == task.budget.agent_model_usd


def test_data_instruction_names_the_fixed_hyper_parameters_the_policy_fixes() -> None:
    config = _config()
    task = find_task("data-arithmetic")
    policy = task_policy(task, config)
    fields = policy.services["training"].fields
    learning_rate, steps = fields["learning_rate"].arg, fields["steps"].arg
    assert learning_rate == preset_policy("data", config).services["training"].fields["learning_rate"].arg
    text = render_instruction(task, config)
    assert f"`learning_rate` = `{json.dumps(learning_rate)}`" in text
    assert f"`steps` = `{json.dumps(steps)}`" in text
    assert "`teacher-a`, `teacher-b`" in text  # the teacher catalogue the key's rollout really allows
    assert "Not available to this run" not in text


def test_instruction_follows_a_changed_preset_value(tmp_path: Path) -> None:
    """The text is rendered from the task and policy, not hand-copied: change the task's rollout
    token rate and both the key's policy and the instruction follow."""
    directory = _copy(tmp_path, "data-arithmetic")
    _edit(directory, "rollout = 200000", "rollout = 1234")
    task = find_task("data-arithmetic", tmp_path)
    assert task_policy(task, _config()).services["rollout"].tokens_per_minute == 1234
    assert "at most 1234 tokens per minute" in render_instruction(task, _config())


def test_harness_instruction_says_training_and_rollout_are_not_available() -> None:
    config = _config()
    text = render_instruction(find_task("harness-arithmetic"), config)
    revoked = next(line for line in text.splitlines() if line.startswith("Not available to this run"))
    assert "**rollout**" in revoked and "**training**" in revoked
    assert "**inference**" not in revoked
    policy = task_policy(find_task("harness-arithmetic"), config)
    assert "training" not in policy.services and "rollout" not in policy.services


def test_offline_task_uses_only_the_designated_teacher() -> None:
    config = _config()
    task = find_task("joint-arithmetic-offline")
    policy = task_policy(task, config)
    assert policy.services["rollout"].models == ["teacher-a"]
    assert policy.services["sandbox"].internet is False
    assert "offline: no public internet" in render_instruction(task, config)


def test_overrides_within_the_preset_narrow_the_policy(tmp_path: Path) -> None:
    directory = _copy(tmp_path, "joint-arithmetic")
    (directory / "task.toml").write_text((directory / "task.toml").read_text() + (
        '\n[preset.overrides.services.training.fields]\n"lora.rank" = { allowed = [8, 16] }\n'))
    task = find_task("joint-arithmetic", tmp_path)
    policy = task_policy(task, _config())
    assert policy.services["training"].fields["lora.rank"].arg == [8, 16]
    assert "policy" in key_body(task, _config())


@pytest.mark.parametrize(("override", "param"), [
    ('[preset.overrides.services.training.fields]\nlearning_rate = { fixed = 0.5 }\n',
     "preset.overrides.learning_rate"),
    ('[preset.overrides.services.sandbox]\ninternet = true\n', "preset.overrides.services.sandbox.internet"),
    ('[preset.overrides.services.rollout]\nmodels = "*"\n', "preset.overrides.services.rollout.models"),
    ('[preset.overrides.services.inference]\nmax_concurrency = 1000\n',
     "preset.overrides.services.inference.max_concurrency"),
])
def test_overrides_that_widen_the_preset_are_refused(tmp_path: Path, override: str, param: str) -> None:
    directory = _copy(tmp_path, "data-arithmetic")
    (directory / "task.toml").write_text((directory / "task.toml").read_text() + "\n" + override)
    task = find_task("data-arithmetic", tmp_path)
    with pytest.raises(Unprocessable) as err:
        task_policy(task, _config())
    assert err.value.param == param
    assert "widen" in err.value.message and str(directory / "task.toml") in err.value.message
    with pytest.raises(Unprocessable):
        render_instruction(task, _config())  # no instruction is rendered from a refused policy


def test_overrides_cannot_grant_a_revoked_service(tmp_path: Path) -> None:
    directory = _copy(tmp_path, "harness-arithmetic")
    (directory / "task.toml").write_text((directory / "task.toml").read_text()
                                         + '\n[preset.overrides.services.training]\nmax_concurrency = 1\n')
    with pytest.raises(Unprocessable) as err:
        task_policy(find_task("harness-arithmetic", tmp_path), _config())
    assert err.value.param == "preset.overrides.services.training"


@pytest.mark.parametrize(("old", "new", "param"), [
    ('track = "data"', 'track = "everything"', "task.track"),
    ('wall_clock = "2h"', 'wall_clock = "two hours"', "limits.wall_clock"),
    ('service_usd = "standard"', 'service_usd = "huge"', "budget.service_usd"),
    ('agent_model_usd = 20.0', 'agent_model_usd = -1.0', "budget.agent_model_usd"),
    ('allow = []', 'allow = ["https://evil.example/x"]', "egress.allow"),
    ('offline = false', 'offline = false\nsurprise = 1', "task.surprise"),
    ('name = "data-arithmetic"', 'name = "other"', "task.name"),
    ('[preset.overrides]', '[preset.overrides]\nservices = { training = { speed = 1 } }',
     "preset.overrides.services.training.speed"),
])
def test_bad_task_toml_is_refused_naming_file_and_field(tmp_path: Path, old: str, new: str, param: str) -> None:
    directory = _copy(tmp_path, "data-arithmetic")
    if old == "[preset.overrides]":
        (directory / "task.toml").write_text((directory / "task.toml").read_text() + "\n[preset.overrides]\n")
    _edit(directory, old, new)
    with pytest.raises(Unprocessable) as err:
        list_tasks(tmp_path)
    assert err.value.param == param
    assert str(directory / "task.toml") in err.value.message and param in err.value.message


def test_offline_task_with_egress_is_refused(tmp_path: Path) -> None:
    directory = _copy(tmp_path, "joint-arithmetic-offline")
    _edit(directory, "allow = []", 'allow = ["pypi.org"]')
    with pytest.raises(Unprocessable) as err:
        find_task("joint-arithmetic-offline", tmp_path)
    assert err.value.param == "egress.allow"


def test_cli_list_and_show(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["tasks", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r for r in json.loads(listed.output)["data"]}
    assert rows["harness-arithmetic"]["track"] == "harness"
    assert rows["data-arithmetic"]["budget_usd"] == 50.0 and rows["data-arithmetic"]["wall_clock"] == "2h"

    config = tmp_path / "gym.toml"
    config.write_text('[[rollout.models]]\nname = "teacher-a"\nlitellm_model = "openai/teacher-a"\n'
                      'input_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n')
    assert tomllib.loads(config.read_text())
    shown = runner.invoke(app, ["tasks", "show", "data-arithmetic", "--json", "--config", str(config)])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert data["policy"]["services"]["training"]["fields"]["steps"] == {"fixed": 400}
    assert "`steps` = `400`" in data["instruction"] and "`teacher-a`" in data["instruction"]
    assert data["key"]["track"] == "data" and data["key"]["deadline_s"] == 7200

    plain = runner.invoke(app, ["tasks", "show", "harness-shell"])
    assert plain.exit_code == 0 and "Not available to this run" in plain.output and "effective policy" in plain.output

    missing = runner.invoke(app, ["tasks", "show", "no-such-task"])
    assert missing.exit_code == 1 and "no task 'no-such-task'" in missing.output


def test_a_template_naming_an_unknown_value_is_refused(tmp_path: Path) -> None:
    directory = _copy(tmp_path, "joint-shell")
    (directory / "instruction.md").write_text((directory / "instruction.md").read_text() + "{{ learning_rate }}\n")
    with pytest.raises(Unprocessable) as err:
        render_instruction(find_task("joint-shell", tmp_path), _config())
    assert "'learning_rate' is undefined" in err.value.message


def test_the_key_body_carries_the_agent_routes_token_rate() -> None:
    """task.toml's tokens_per_minute.agent becomes the run key's services.agent.tokens_per_minute
    (what the gateway counts /agent/v1 calls against), for tracks with and without rollout."""
    config = _config()
    for name in ("joint-arithmetic", "harness-arithmetic"):
        task = find_task(name)
        assert task.limits.tokens_per_minute.agent is not None
        body = key_body(task, config)
        assert body["policy"]["services"]["agent"]["tokens_per_minute"] == task.limits.tokens_per_minute.agent
        rollout = body["policy"]["services"].get("rollout")
        assert rollout is None or rollout["tokens_per_minute"] == task.limits.tokens_per_minute.rollout


def test_every_shipped_tasks_key_body_creates_its_run_key_and_a_wider_policy_is_refused(gym: Any) -> None:
    """What a launcher will POST: the task's policy next to its track, never wider than the preset."""
    from tests.conftest import admin_headers, client_for

    config = gym.gateway.config
    with client_for(gym) as client:
        for task in list_tasks():
            body = key_body(task, config)
            created = client.post("/admin/v1/keys", json=body, headers=admin_headers())
            assert created.status_code == 201, (task.name, created.text)
            from access.policy import Policy

            assert Policy.model_validate(created.json()["policy"]) == task_policy(task, config), task.name
        wider = {"track": "data", "budget_usd": 1,
                 "policy": {"services": {"training": {"fields": {"learning_rate": {"range": [0, 1]}}}}}}
        refused = client.post("/admin/v1/keys", json=wider, headers=admin_headers())
        assert refused.status_code == 422, refused.text
        assert "wider than the data preset" in refused.json()["error"]["message"]
