"""``rsigym tasks …``: what a run of a track is (tasks/<name>/task.toml, instruction.md)."""

from __future__ import annotations

import json
from typing import Any

import typer

from kit.display_text import PlainTable
from ops.cli.common import ConfigOpt, JsonOpt, TasksDirOpt, console, exit_on_refusal, gym_settings

app = typer.Typer(help="Tasks: what a run of a track is (tasks/<name>/task.toml, instruction.md).",
                  no_args_is_help=True)


@app.command("list")
def tasks_list(tasks_dir: TasksDirOpt = None, as_json: JsonOpt = False) -> None:
    """Every task: track, benchmarks, budgets, wall clock."""
    from ops.tasks import TASKS, list_tasks

    rows = [t.summary() for t in exit_on_refusal(lambda: list_tasks(tasks_dir or TASKS))]
    if as_json:
        typer.echo(json.dumps({"data": rows}, indent=2))
        return
    table = PlainTable("name", "track", "offline", "benchmarks", "budget (USD)", "agent budget (USD)", "wall clock")
    for r in rows:
        table.add_row(r["name"], r["track"], "yes" if r["offline"] else "no", ", ".join(r["benchmarks"]),
                      f"{r['budget_usd']:.2f}", f"{r['agent_budget_usd']:.2f}", r["wall_clock"])
    console.print(table)


@app.command("show")
def tasks_show(name: str, tasks_dir: TasksDirOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """A task's rendered instruction and the effective policy its run key gets."""
    from kit.config import load_config
    from ops.tasks import TASKS, find_task, key_body, render_instruction, task_policy

    def build() -> dict[str, Any]:
        gym_config = load_config(config or gym_settings().config)
        task = find_task(name, tasks_dir or TASKS)
        return {**task.summary(), "instruction": render_instruction(task, gym_config),
                "policy": task_policy(task, gym_config).model_dump(mode="json", exclude_none=True),
                "key": key_body(task, gym_config)}

    shown = exit_on_refusal(build)
    if as_json:
        typer.echo(json.dumps(shown, indent=2))
        return
    typer.echo(shown["instruction"])
    typer.echo("--- effective policy ---")
    typer.echo(json.dumps(shown["policy"], indent=2))
