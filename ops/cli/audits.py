"""``rsigym audit RUN`` (one verdict over a run's checks) and ``rsigym audit agreement A B``
(agreement between two label sets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from kit.display_text import PlainTable
from kit.errors import GymError
from ops.cli.common import DataDirOpt, JsonOpt, UrlOpt, console, with_admin
from ops.cli.records import chain_word


def _agreement(files: list[Path], as_json: bool) -> None:
    from services.records.audits.agreement import agreement

    if len(files) != 2:
        raise typer.BadParameter("rsigym audit agreement A.json B.json")
    try:
        a, b = (json.loads(f.read_text(encoding="utf-8")) for f in files)
    except (OSError, ValueError) as err:
        raise typer.BadParameter(f"cannot read the label files: {err}") from err
    try:
        result = agreement(a, b)
    except GymError as err:  # labels that are not audit outputs or {category: code} maps
        raise typer.BadParameter(err.message) from err
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    table = PlainTable("category", "units", "raw agreement", "Cohen's kappa")
    for cat, row in result["per_category"].items():
        kappa = row.get("kappa")
        table.add_row(cat, str(row.get("n", "")), f"{row['agreement']:.3f}" if row.get("agreement") is not None else "-",
                      "-" if kappa is None else f"{kappa:.3f}")
    overall = result["overall"]
    table.add_row(Text("all", style="bold"), str(overall.get("n", "")),
                  f"{overall['agreement']:.3f}" if overall.get("agreement") is not None else "-",
                  "-" if overall.get("kappa") is None else f"{overall['kappa']:.3f}")
    console.print(table)


def _audit_summary(report: dict[str, Any]) -> Table:
    table = PlainTable("check", "verdict", "findings")
    for c in report["checks"]:
        shown = [f for f in c["findings"] if f["code"] not in ("NOT_OBSERVED", "NOT_APPLICABLE")]
        text = "; ".join(f"{f['code']} {f['category']}" + (f" ({len(f['task_ids'])} tasks)" if f.get("task_ids") else "")
                         for f in shown[:6]) + (" …" if len(shown) > 6 else "")
        table.add_row(c["name"], c["verdict"], text or "-")
    return table


def run_audit(run_id: str, *, trajectory: Path | None, data_dir: Path | None, url: str | None) -> dict[str, Any]:
    text = trajectory.read_text(encoding="utf-8") if trajectory else None
    return with_admin(data_dir, url, lambda c: c.audit(run_id, trajectory=text))


def audit(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run to audit (its root key id), or "
                                                              "`agreement` followed by two label files.")],
    files: Annotated[list[Path] | None, typer.Argument(help="agreement: A.json B.json", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Directory for audit.md and audit.json.")] = None,
    trajectory: Annotated[Path | None, typer.Option("--trajectory", help="The research agent's trajectory "
                                                                         "(a file the judge reads).")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Audit a run: contamination, provenance, harness and behaviour checks, one verdict.

    Exit 0 when the run is accepted, 2 when it is flagged. `rsigym audit agreement A.json B.json`
    prints Cohen's kappa and raw agreement between two label sets per category."""
    if run_id == "agreement":
        _agreement(files or [], as_json)
        return
    if files:
        raise typer.BadParameter("only `rsigym audit agreement A.json B.json` takes files")
    from services.records.audits.run import public_view, write_audit_report

    report = run_audit(run_id, trajectory=trajectory, data_dir=data_dir, url=url)
    written = write_audit_report(report, out) if out is not None else ()
    if as_json:
        typer.echo(json.dumps(public_view(report), indent=2))
    else:
        rate = report.get("hacking_rate")
        console.print(f"run {run_id}: [bold]{report['status']}[/bold], hacking rate "
                      f"{'-' if rate is None else f'{rate:.3f}'}, record chain "
                      f"{chain_word(report.get('chain') or {})}")
        console.print(_audit_summary(report))
        if written:
            console.print("written: " + ", ".join(str(p) for p in written))
    if report["status"] != "accepted":
        raise typer.Exit(2)
