"""``rsigym list KIND``: what runs made, across runs (the admin API's list routes, ops/admin_lists.py)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from kit.display_text import PlainTable
from ops.cli.common import DataDirOpt, JsonOpt, UrlOpt, admin_request, console, err_console

ListKindArg = Annotated[str, typer.Argument(help="datasets | training-jobs | checkpoints | evaluation-jobs | "
                                                 "sandboxes | submissions")]


def _cell(value: Any) -> str:
    text = "" if value is None else json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 40 else text[:39] + "…"


def list_across_runs(
    kind: ListKindArg,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only what this key (run or child) made.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="Only rows in this status (jobs, sandboxes).")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Rows a page (1..500).")] = 50,
    cursor: Annotated[str | None, typer.Option("--cursor", help="The next_cursor of the page before.")] = None,
    every: Annotated[bool, typer.Option("--all", help="Follow the cursor to the last page.")] = False,
    as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None,
) -> None:
    """What runs made, across runs, newest first: datasets, training jobs, checkpoints,
    evaluation jobs, sandboxes or submissions (what an auditor looks for before reading)."""
    from ops.admin_lists import KINDS

    if kind not in KINDS:
        err_console.print(f"[red]error[/red]: unknown list {kind!r}; expected one of {', '.join(KINDS)}")
        raise typer.Exit(2)
    params = {k: v for k, v in {"run_id": run, "key_id": key, "status": status, "limit": limit}.items() if v is not None}
    rows: list[dict[str, Any]] = []
    while True:
        page = admin_request("GET", f"/admin/v1{KINDS[kind].path}", data_dir, url,
                     params={**params, **({"cursor": cursor} if cursor else {})})
        rows.extend(page["data"])
        cursor = page["next_cursor"]
        if not every or cursor is None:
            break
    if as_json:
        typer.echo(json.dumps({"object": "list", "kind": kind, "data": rows, "next_cursor": cursor}, indent=2))
        return
    columns = list(KINDS[kind].brief)
    table = PlainTable(*columns)
    for r in rows:
        table.add_row(*(_cell(r.get(c)) for c in columns))
    console.print(table)
    console.print(f"{len(rows)} {kind}" + (f"; more with --cursor {cursor}" if cursor else ""))
