"""``rsigym agents …``: the research agents the launcher can start (ops/agents.toml) and the
toolbox their CLIs run from (ops/agent_toolbox.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kit.display_text import PlainTable
from ops.cli.common import JsonOpt, console, err_console, exit_on_refusal

app = typer.Typer(help="Research agents: list them, install the pinned CLIs they run (Claude Code, Codex).",
                  no_args_is_help=True)

AgentsFileOpt = Annotated[Path | None, typer.Option("--agents", help="The agent registry (TOML; default: the gym's "
                                                    "ops/agents.toml).")]
DirOpt = Annotated[Path | None, typer.Option("--dir", help="The toolbox directory (default RSIGYM_AGENTS_DIR, else "
                                             "~/.local/share/rsigym/agents).")]


@app.command("install")
def agents_install(
    names: Annotated[list[str] | None, typer.Argument(help="Agents whose pinned CLIs to install (e.g. claude-code "
                                                       "codex); none: only the agent SDK.")] = None,
    agents_file: AgentsFileOpt = None, directory: DirOpt = None, as_json: JsonOpt = False,
) -> None:
    """Install the agents' pinned CLIs from the npm registry, and the agent SDK with `gym mcp`, into
    the toolbox the launcher binds read-only into every run."""
    from ops import agent_toolbox, launcher

    def install() -> dict[str, object]:
        registry = launcher.load_agents(agents_file or launcher.AGENTS)
        unknown = [n for n in names or [] if n not in registry]
        if unknown:
            from kit.errors import Unprocessable

            raise Unprocessable(f"no agent {', '.join(unknown)} (agents: {', '.join(sorted(registry))})")
        specs = [spec for n in names or [] for spec in registry[n].npm]
        err_console.print(f"installing {', '.join(specs) or 'the agent SDK'} into "
                          f"{directory or agent_toolbox.toolbox_dir()} …")
        return agent_toolbox.install(specs, directory)

    done = exit_on_refusal(install)
    if as_json:
        typer.echo(json.dumps(done, indent=2))
        return
    console.print(f"toolbox ready: {done['python']['sdk']} (with `gym mcp`)"  # type: ignore[index]
                  + "".join(f", {name} {version}" for name, version in done["npm"].items()))  # type: ignore[attr-defined]


@app.command("list")
def agents_list(agents_file: AgentsFileOpt = None, as_json: JsonOpt = False) -> None:
    """The registry's agents, what each needs from the toolbox and whether it is installed."""
    from ops import agent_toolbox, launcher

    registry = exit_on_refusal(lambda: launcher.load_agents(agents_file or launcher.AGENTS))
    rows = [{"name": name, "description": t.description, "npm": t.npm,
             "installed": not agent_toolbox.missing(t.npm)} for name, t in registry.items()]
    if as_json:
        typer.echo(json.dumps({"toolbox": str(agent_toolbox.toolbox_dir()), "stale": agent_toolbox.stale(),
                               "data": rows}, indent=2))
        return
    if agent_toolbox.stale():
        err_console.print("the toolbox's agent SDK is not this gym's: run `rsigym agents install` again")
    table = PlainTable("agent", "needs", "installed", "description")
    for row in rows:
        table.add_row(row["name"], ", ".join(row["npm"]) or "-", "yes" if row["installed"] else "no",  # type: ignore[arg-type]
                      row["description"])
    console.print(table)
