"""``rsigym records RUN``: a run's platform events, its experiments, or the check of its hash chain."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from kit.display_text import PlainTable, plain
from ops.cli.common import DataDirOpt, JsonOpt, UrlOpt, console, with_admin


def chain_word(chain: dict[str, Any]) -> str:
    """intact | unverifiable (its head could not be checked against the anchor outside the store) |
    BROKEN, from a chain check's view (services/records/events.py)."""
    status = chain.get("status") or ("intact" if chain.get("ok") else "BROKEN")
    return "BROKEN" if status == "broken" else str(status)


def records(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run (its root key id).")],
    what: Annotated[str, typer.Argument(help="events | experiments | chain")] = "experiments",
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """A run's record: its platform events, its experiments (with integrity status), or the check
    of its hash chain (exit 1 when the chain is broken)."""
    if what not in ("events", "experiments", "chain"):
        raise typer.BadParameter("events, experiments or chain")
    body = with_admin(data_dir, url, lambda c: c.run_records(run_id, what))
    if as_json:
        typer.echo(json.dumps(body, indent=2))
    elif what == "chain":
        console.print(f"run {run_id}: {body['events']} events, head at {body['head_seq']}: "
                      + {"intact": "[green]intact[/green]", "unverifiable": "[yellow]UNVERIFIABLE[/yellow]"}.get(
                          chain_word(body), "[red]BROKEN[/red]"))
        for p in body.get("problems", []):
            console.print(plain(f"  event {p['seq']}: {p['problem']} — {p['detail']}"))
        if chain_word(body) == "unverifiable":
            console.print(plain(f"  anchor: {(body.get('anchor') or {}).get('detail')}"))
    elif what == "events":
        table = PlainTable("seq", "kind", "key", "experiment", "at", "data")
        for e in body["data"]:
            table.add_row(str(e["seq"]), e["kind"], e.get("key_id") or "-", e.get("experiment_id") or "-",
                          e["created_at"][:19], json.dumps(e["data"])[:80])
        console.print(table)
    else:
        table = PlainTable("experiment", "owner", "name", "status", "parents", "checkpoints", "reasons")
        for e in body["data"]:
            table.add_row(e["id"], e["owner_key_id"], e["name"], e["status"], ", ".join(e.get("parents") or []) or "-",
                          ", ".join((e.get("theta_out") or {}).get("checkpoints") or []) or "-",
                          "; ".join(e.get("reasons") or [])[:80])
        console.print(table)
    if what == "chain" and not body["ok"]:
        raise typer.Exit(1)
