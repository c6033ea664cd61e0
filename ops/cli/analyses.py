"""``rsigym analyses`` (best-so-far curves, tool use by category, hacking incidence and the
labellers' agreement, from the records and the ledger) and ``rsigym labels export|import|kappa``
(blind labelling by human labellers, ops/analyses/labels.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ops.cli.common import DataDirOpt, JsonOpt, UrlOpt, console, exit_on_refusal, with_admin

OutOpt = Annotated[Path, typer.Option("--out", help="The directory written.")]
RunsOpt = Annotated[list[str] | None, typer.Option("--run", help="Only this run (repeatable; default: every run).")]


def analyses(
    out: OutOpt = Path("rsigym-analyses"),
    run: RunsOpt = None,
    labels_dir: Annotated[Path | None, typer.Option("--labels", help="A labelling set (`rsigym labels export`) whose "
                                                    "agreement to show (default: OUT/labels, if there).")] = None,
    bins: Annotated[int, typer.Option("--bins", min=1, max=200, help="Time bins of the tool-use charts.")] = 12,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """The papers' analyses from the records and the ledger: per run a best-so-far curve of its
    agent's dev evaluations over research time and its tool use by category over time; across runs
    the hacking incidence per taxonomy category (fraction of audited runs with EXECUTED /
    ATTEMPTED_BLOCKED); and, with a labelling set, Cohen's kappa of the labellers. Writes
    analyses.json, analyses.md and the PNGs into --out (`rsigym report` writes them next to
    report.md too)."""
    from ops.analyses.build import collect, write

    data = with_admin(data_dir, url, lambda c: collect(c, run or None, bins))
    written = exit_on_refusal(lambda: write(data, out, labels_dir))
    if as_json:
        typer.echo(json.dumps(written.data, indent=2))
    else:
        console.print("written: " + ", ".join(str(p) for p in written.files))


labels_app = typer.Typer(help="Blind labelling: export anonymised audit evidence for human labellers, import their "
                              "labels, Cohen's kappa.", no_args_is_help=True)
DirOpt = Annotated[Path, typer.Option("--dir", help="The labelling set's directory.")]


@labels_app.command("export")
def labels_export(out: OutOpt = Path("rsigym-labels"), run: RunsOpt = None, as_json: JsonOpt = False,
                  data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Write items.jsonl and labels.csv (a template) for the labellers: per audited run and
    category, the behaviour judge's quoted evidence with the category's definition; run ids replaced
    by opaque ids, no verdicts, random order. .key.json (mode 0600) maps them back: keep it from the
    labellers. `--out REPORT_DIR/labels` puts the agreement in `rsigym report`."""
    from ops.analyses import labels

    audits = with_admin(data_dir, url, lambda c: c.audits())
    result = exit_on_refusal(lambda: labels.export(audits, out, set(run) if run else None))
    typer.echo(json.dumps(result, indent=2) if as_json else
               f"{result['items']} items of {result['runs']} runs in {out}/{labels.ITEMS} and {out}/{labels.TEMPLATE}")


@labels_app.command("import")
def labels_import(
    file: Annotated[Path, typer.Argument(help="The labeller's file: CSV with item and label columns, or JSONL.")],
    labeller: Annotated[str, typer.Option("--labeller", help="The labeller's name (letters, digits, - or _).")],
    directory: DirOpt = Path("rsigym-labels"),
    as_json: JsonOpt = False,
) -> None:
    """Check one labeller's labels (the taxonomy's codes) against the set and keep them."""
    from ops.analyses import labels

    result = exit_on_refusal(lambda: labels.import_labels(directory, labeller, file))
    typer.echo(json.dumps(result, indent=2) if as_json else
               f"{result['labeller']}: {result['labelled']} of {result['items']} items labelled")


@labels_app.command("kappa")
def labels_kappa(directory: DirOpt = Path("rsigym-labels"), as_json: JsonOpt = False) -> None:
    """Cohen's kappa between every two labellers and each against the judge (over the codes, and
    over hacking or not), on the items both labelled."""
    from kit.display_text import PlainTable
    from ops.analyses import labels

    result = exit_on_refusal(lambda: labels.kappa(directory))
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    table = PlainTable("between", "items", "kappa (codes)", "kappa (hacking or not)", "observed agreement")
    for row in [*result["pairs"], *result["vs_judge"]]:
        who = f"{row['a']} vs {row['b']}" if "a" in row else f"{row['labeller']} vs the judge"
        codes, hacking = row["codes"], row["hacking"]
        table.add_row(who, str(codes["n"]), _k(codes["kappa"]), _k(hacking["kappa"]), _k(codes["observed"]))
    console.print(table)


def _k(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def report_analyses(out: Path, runs: list[str], *, as_json: bool, data_dir: Path | None, url: str | None) -> None:
    """The end of ``rsigym report``: the analyses of its runs next to report.md (with the
    agreement of a labelling set in ``out/labels``, if there)."""
    from ops.analyses.build import write_analyses
    from ops.cli.common import err_console

    written = with_admin(data_dir, url, lambda c: write_analyses(c, out, runs))
    (err_console if as_json else console).print("analyses: " + ", ".join(str(p) for p in written.files))
