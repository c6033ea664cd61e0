"""``rsigym keys …`` (run keys: create, inspect, fund, pause, revoke) and ``rsigym ledger``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kit.display_text import PlainTable
from ops.cli.common import DataDirOpt, JsonOpt, UrlOpt, admin_request, console, err_console

app = typer.Typer(help="Run keys: create, inspect, fund, pause, revoke.", no_args_is_help=True)


def _key_table(rows: list[dict[str, Any]]) -> Table:
    """Each key with its run's state (access/lifecycle.py); an ended run's remaining budget is
    shown as unspent (nothing can spend it)."""
    table = PlainTable("id", "name", "track", "state", "budget", "spent", "reserved", "remaining", "parent")
    for r in rows:
        money = [f"{r[k]:.6f}" if r.get(k) is not None else "-" for k in ("budget_usd", "spent_usd", "reserved_usd", "remaining_usd")]
        if r.get("unspent_usd") is not None:
            money[-1] = f"{r['unspent_usd']:.6f} unspent"
        table.add_row(r["id"], r.get("name") or "", r.get("track") or "", r.get("state") or r["status"], *money,
                      r.get("parent_id") or "")
    return table


def _key_details(row: dict[str, Any]) -> Table:
    table = PlainTable(show_header=False, box=None)
    money = ("unspent_usd",) if row.get("unspent_usd") is not None else ("remaining_usd",)
    for field in ("id", "name", "track", "state", "status", "task", "agent", "agent_version", "agent_model",
                  "agent_exit", "budget_usd", "spent_usd", "reserved_usd", *money, "ends_at", "parent_id", "run_id",
                  "created_at"):
        if row.get(field) is not None:
            table.add_row(field, str(row[field]))
    return table


def _emit(data: Any, as_json: bool, rows: list[dict[str, Any]] | None = None) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    elif rows is not None:
        console.print(_key_table(rows))
    else:
        console.print(_key_details(data))


@app.command("create")
def keys_create(
    budget: Annotated[str, typer.Option("--budget", help="Budget in USD, or a named budget of the track "
                                        "(small, standard, large).")],
    track: Annotated[str | None, typer.Option("--track", help="data, harness or joint (offline alone: joint + "
                                              "offline)")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="The offline modifier: no sandbox internet, "
                                          "rollout only from the designated teacher.")] = False,
    policy_file: Annotated[Path | None, typer.Option("--policy-file", help="A policy (TOML or JSON); token "
                                                     "rates: tokens_per_minute under [services.rollout] and "
                                                     "[services.agent] (the agent route).")] = None,
    name: Annotated[str | None, typer.Option("--name")] = None,
    deadline: Annotated[str | None, typer.Option("--deadline", help="The run's wall-clock limit from now "
                                                 "(90s, 30m, 2h, 1d): after it every key of the run is refused "
                                                 "and its jobs and sandboxes are stopped.")] = None,
    agent_budget: Annotated[float | None, typer.Option("--agent-budget", help="The run's agent-model budget in "
                                                       "USD (its research agent's own LLM on /agent/v1, metered "
                                                       "apart from the service budget).")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Create a run key. The key is printed once; only its hash is stored."""
    from access.presets import policy_from_file

    if (track is None) == (policy_file is None):
        err_console.print("[red]error[/red]: give exactly one of --track or --policy-file")
        raise typer.Exit(2)
    try:
        body: dict[str, Any] = {"budget_usd": float(budget), "name": name}
    except ValueError:
        body = {"budget": budget, "name": name}
    if offline and not track:
        err_console.print("[red]error[/red]: --offline is a modifier on a --track")
        raise typer.Exit(2)
    if deadline is not None:
        from billing.deadlines import parse_duration

        try:
            body["deadline_s"] = parse_duration(deadline)
        except ValueError as err:
            err_console.print(f"[red]error[/red]: --deadline: {err}")
            raise typer.Exit(2) from err
    if agent_budget is not None:
        body["agent_budget_usd"] = agent_budget
    if track:
        body["track"] = track
        if offline:
            body["offline"] = True
    else:
        body["policy"] = policy_from_file(policy_file).model_dump(mode="json")  # type: ignore[arg-type]
    created = admin_request("POST", "/admin/v1/keys", data_dir, url, json=body)
    if as_json:
        typer.echo(json.dumps({"id": created["id"], "key": created["key"], "track": created["track"],
                               "budget_usd": created["budget_usd"]}))
    else:
        console.print(_key_details(created))
        console.print(f"key (shown once): [bold]{created['key']}[/bold]")


@app.command("list")
def keys_list(as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """All keys, children included."""
    rows = admin_request("GET", "/admin/v1/keys", data_dir, url)["data"]
    _emit({"data": rows}, as_json, rows)


@app.command("show")
def keys_show(key_id: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    _emit(admin_request("GET", f"/admin/v1/keys/{key_id}", data_dir, url), as_json)


@app.command("topup")
def keys_topup(key_id: str, usd: float, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Add USD to a key's budget."""
    _emit(admin_request("POST", f"/admin/v1/keys/{key_id}/topup", data_dir, url, json={"amount_usd": usd}), as_json)


def _status_command(action: str) -> None:
    def command(key_id: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
        _emit(admin_request("POST", f"/admin/v1/keys/{key_id}/{action}", data_dir, url), as_json)

    command.__doc__ = f"{action.capitalize()} a key (and with it every child key)."
    app.command(action)(command)


for _action in ("pause", "resume", "revoke"):
    _status_command(_action)


@app.command("policy")
def keys_policy(key_id: str, policy_file: Path, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Replace a key's policy with one from a file."""
    from access.presets import policy_from_file

    policy = policy_from_file(policy_file).model_dump(mode="json")
    _emit(admin_request("PATCH", f"/admin/v1/keys/{key_id}", data_dir, url, json={"policy": policy}), as_json)


def ledger(key_id: str, agent: Annotated[bool, typer.Option("--agent", help="The run's agent-model meter (its "
                                                             "research agent's own LLM) instead of its service "
                                                             "budget.")] = False,
           as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """The itemized ledger of a key and its children (--agent: of the run's agent-model meter)."""
    if agent:
        meter = admin_request("GET", f"/admin/v1/keys/{key_id}", data_dir, url).get("agent_meter_id")
        if not meter:
            err_console.print(f"[red]error[/red]: {key_id} has no agent-model meter (no --agent-budget)")
            raise typer.Exit(1)
        key_id = meter
    rows = admin_request("GET", f"/admin/v1/keys/{key_id}/ledger", data_dir, url)["data"]
    if as_json:
        typer.echo(json.dumps({"data": rows}, indent=2))
        return
    table = PlainTable("time", "key", "service", "operation", "model", "status", "estimate", "actual")
    for r in rows:
        actual = "-" if r["actual_usd"] is None else f"{r['actual_usd']:.9f}"
        table.add_row(r["created_at"][:19], r["key_id"], r["service"], r["operation"], r.get("model") or "",
                      r["status"], f"{r['estimate_usd']:.9f}", actual)
    console.print(table)
    total = sum(r["actual_usd"] or 0 for r in rows)
    console.print(f"{len(rows)} rows, {total:.9f} USD charged")


@app.command("spend")
def keys_spend(
    by: Annotated[str, typer.Option("--by", help="model (per model and service) or key (per key and model).")] = "model",
    run: Annotated[str | None, typer.Option("--run", help="Only this run's keys.")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """What runs were charged, from the ledger, by model or by key (GET /admin/v1/spend)."""
    params = {"by": by, **({"run_id": run} if run else {})}
    answer = admin_request("GET", "/admin/v1/spend", data_dir, url, params=params)
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    first = ("model", "service") if by == "model" else ("key_id", "key_name", "model")
    table = PlainTable(*first, "calls", "charged_usd")
    for r in answer["data"]:
        table.add_row(*[str(r[f]) for f in first], str(r["calls"]), f"{r['charged_usd']:.9f}")
    console.print(table)
    console.print(f"{answer['total_usd']:.9f} USD charged")
