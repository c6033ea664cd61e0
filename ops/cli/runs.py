"""``rsigym run …`` (start a research agent on a task, list, show, stop, logs) and
``rsigym watch RUN`` (a live view of one run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from kit.display_text import PlainTable, inert
from ops.cli.admin_client import AdminClient, AdminError
from ops.cli.common import (
    ConfigOpt,
    DataDirOpt,
    JsonOpt,
    TasksDirOpt,
    UrlOpt,
    console,
    exit_on_refusal,
    gym_settings,
    with_admin,
)

app = typer.Typer(help="Runs: start a research agent on a task (embedded mode), list, show, stop, logs.",
                  no_args_is_help=True)


@app.command("start", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_start(
    ctx: typer.Context,
    task: Annotated[str, typer.Option("--task", help="Task name (rsigym tasks list).")],
    agent: Annotated[str, typer.Option("--agent", help="Agent template (ops/agents.toml).")],
    budget: Annotated[str | None, typer.Option("--budget", help="Service budget: USD or small|standard|large.")] = None,
    mode: Annotated[str, typer.Option("--mode", help="embedded: the agent in its own namespaces on this host "
                                      "(bubblewrap); compose: the track's agent container (docker compose run).")]
    = "embedded",
    compose_file: Annotated[Path, typer.Option("--compose-file", help="Compose mode: the gym's compose file "
                                               "(its core already up).")] = Path("docker-compose.yml"),
    project: Annotated[str, typer.Option("--project", help="Compose mode: the compose project name.")] = "rsigym",
    agents_file: Annotated[Path | None, typer.Option("--agents", help="The agent registry (TOML; default: the "
                                                     "gym's ops/agents.toml).")] = None,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Start N runs of this agent on this task, each its "
                                        "own key and run, in one repeat group (the report aggregates them).")] = 1,
    seed: Annotated[int | None, typer.Option("--seed", min=0, help="Seed the agent: the i-th run (from 0) gets "
                                             "S+i, which seeds what it asks the gym to sample (the baseline and dag "
                                             "agents). LLM agents (claude-code, codex) take no seed: they are "
                                             "repeated, not seeded.")] = None,
    from_run: Annotated[str | None, typer.Option("--from", help="Start from RUN's accepted system: its scored, "
                                                 "audit-accepted submission (checkpoint and harness) is this run's "
                                                 "initial system, one generation on.")] = None,
    agent_model: Annotated[str | None, typer.Option("--agent-model", help="The research agent's own model: one of "
                                                    "the gym's agent_models, or one the gym serves itself: "
                                                    "gym:<base model>, gym:<checkpoint id> or gym:from:<RUN> (an "
                                                    "ended run's scored, audit-accepted submission). Default: the "
                                                    "first of agent_models.")] = None,
    tasks_dir: TasksDirOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False,
    data_dir: DataDirOpt = None, url: UrlOpt = None,
) -> None:
    """Mint the run key, render the instruction and start the agent (arguments after ``--`` go to it).

    --repeat N starts N runs; their repeat group is in each run key's name, each run's index and
    seed in its run.json (`rsigym run list --json`)."""
    from kit.config import load_config
    from ops import launcher
    from ops.tasks import TASKS, find_task, key_body, render_instruction

    settings = gym_settings(data_dir)
    if mode not in ("embedded", "compose"):
        raise typer.BadParameter("--mode is embedded or compose")
    compose = None
    if mode == "compose":
        compose = launcher.ComposeTarget(file=compose_file.resolve(), project_dir=compose_file.resolve().parent,
                                         project=project)

    def start(slot: launcher.Repeat | None) -> launcher.RunRecord:
        gym_config = load_config(config or settings.config)
        found = find_task(task, tasks_dir or TASKS)
        amount: float | str | None = budget
        if budget is not None and budget not in ("small", "standard", "large"):
            try:
                amount = float(budget)
            except ValueError:
                raise typer.BadParameter("--budget is USD or small|standard|large") from None
        return launcher.start_run(
            data_dir=Path(settings.data_dir), gateway_url=url or settings.url, client=AdminClient(settings, url),
            task=found, key_body=key_body(found, gym_config, budget=amount),
            instruction=lambda minted: render_instruction(found, gym_config, minted), agent=agent,
            config=gym_config, extra_args=list(ctx.args), compose=compose, agents_file=agents_file or launcher.AGENTS,
            repeat=slot, from_run=from_run, chosen_agent_model=agent_model)

    slots = exit_on_refusal(lambda: launcher.repeat_slots(repeat, seed))
    records: list[launcher.RunRecord] = []
    try:  # a run that cannot start stops the rest (exit 1); those already started go on and are shown
        for slot in slots:
            records.append(exit_on_refusal(lambda slot=slot: start(slot)))  # type: ignore[misc]
            if not as_json:
                _print_started(records[-1])
    finally:
        if as_json and records:  # one run: its record, as before; a group: all of them
            typer.echo(records[0].model_dump_json(indent=2) if repeat == 1 else json.dumps(
                {"repeat_group": records[0].repeat_group, "data": [r.model_dump() for r in records]}, indent=2))


def _print_started(record: Any) -> None:
    group = "" if record.repeat_group is None else (
        f" [{record.repeat_group} {record.repeat_index + 1}/{record.repeat_count}"
        f"{'' if record.seed is None else f', seed {record.seed}'}]")
    console.print(f"run {record.run} started ({record.mode}): agent {record.agent} {record.agent_version} "
                  f"(pid {record.pid}) on task {record.task}{group}")


def _run_row(r: Any) -> list[str]:
    return [r.run, r.task, f"{r.agent} {r.agent_version or ''}".strip(), r.state or "", str(r.pid), r.started_at,
            "" if r.exit_code is None else str(r.exit_code)]


def with_gym_states(records: list[Any], data_dir: Path | None, url: str | None) -> list[Any]:
    """The records with the gym's view of each run's state (its run key's ``state``: pauses,
    audits and scores are known there), so ``run list/show`` and ``keys show`` agree; a record
    keeps its own (derived from the same facts) when the gym cannot be asked."""
    if not records:
        return records
    try:
        keys = {k["id"]: k for k in AdminClient(gym_settings(data_dir), url).keys()}
    except (AdminError, SystemExit):  # no admin token, the gym down: what this data dir knows
        return records
    return [r.model_copy(update={"state": keys[r.key_id]["state"]}) if r.key_id in keys and keys[r.key_id].get("state")
            else r for r in records]


@app.command("list")
def run_list(as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Every run started from this data dir, with its state (running, paused, ended (why), audited,
    scored: access/lifecycle.py)."""
    from ops.launcher import list_runs

    rows = with_gym_states(exit_on_refusal(lambda: list_runs(Path(gym_settings(data_dir).data_dir))), data_dir, url)
    if as_json:
        typer.echo(json.dumps({"data": [r.model_dump() for r in rows]}, indent=2))
        return
    table = PlainTable("run", "task", "agent", "state", "pid", "started", "exit")
    for r in rows:
        table.add_row(*_run_row(r))
    console.print(table)


@app.command("show")
def run_show(run: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    from ops.launcher import show_run
    from services.evaluation.submission_rule import SUBMISSION_RULE

    [record] = with_gym_states([exit_on_refusal(lambda: show_run(Path(gym_settings(data_dir).data_dir), run))],
                               data_dir, url)
    typer.echo(record.model_dump_json(indent=2) if as_json
               else "\n".join([*(f"{k}: {v}" for k, v in record), f"submission rule: {SUBMISSION_RULE}"]))


@app.command("stop")
def run_stop(run: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Kill the agent and end the run (its deadline set to now)."""
    from ops.launcher import stop_run

    settings = gym_settings(data_dir)
    record = exit_on_refusal(lambda: stop_run(Path(settings.data_dir), run, AdminClient(settings, url)))
    typer.echo(record.model_dump_json(indent=2) if as_json else f"run {record.run} stopped")


@app.command("logs")
def run_logs(run: str, data_dir: DataDirOpt = None) -> None:
    """The agent's stdout and stderr."""
    from ops.launcher import logs

    typer.echo(inert(exit_on_refusal(lambda: logs(Path(gym_settings(data_dir).data_dir), run)), lines=True), nl=False)


def watch(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run (its root key id).")],
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 2.0,
    stall_minutes: Annotated[float, typer.Option("--stall-minutes", help="Warn after this long without an "
                                                                         "agent call.")] = 10.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one snapshot as JSON and exit (implies --once).")]
    = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """A live view of a run: service and agent-model spend, recent agent turns, running jobs,
    last evaluation scores, the audit status and stall warnings (Ctrl-C to leave)."""
    from ops.cli.watch import fetch_snapshot
    from ops.cli.watch import watch as watch_run

    if interval <= 0 or stall_minutes <= 0:
        raise typer.BadParameter("--interval and --stall-minutes must be > 0")
    if as_json:
        typer.echo(json.dumps(with_admin(data_dir, url, lambda c: fetch_snapshot(c, run_id)), indent=2, default=str))
        return
    with_admin(data_dir, url, lambda c: watch_run(c, run_id, console=console, interval=interval,
                                              stall_minutes=stall_minutes, once=once))
