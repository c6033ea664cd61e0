"""``rsigym``: the operator CLI (the entry point, and ``python -m ops.cli.main``), assembled from
one module per command group. A group's module holds its sub-app (``app``); the top-level commands
are plain functions, registered here in the order ``rsigym --help`` lists them."""

from __future__ import annotations

import typer

from ops.cli import agents, audits, benchmarks, demos, keys, lists, models, records, runs, scoring, serving, tasks
from ops.cli import analyses as analyses_cli
from ops.cli.common import print_error

app = typer.Typer(help="RSIGym operator CLI.", no_args_is_help=True, add_completion=False)
app.command()(serving.up)
app.command()(serving.serve)
app.command()(serving.worker)
app.command()(serving.migrate)
app.command("egress-proxy")(serving.egress_proxy)
app.command("run-relay")(serving.run_relay)
app.command()(serving.standin)
app.command()(keys.ledger)
app.command("list")(lists.list_across_runs)
app.command()(scoring.score)
app.command()(scoring.report)
app.command()(audits.audit)
app.command()(records.records)
app.command()(analyses_cli.analyses)
app.command()(runs.watch)
app.command()(demos.demo)
app.add_typer(keys.app, name="keys")
app.add_typer(models.app, name="models")
app.add_typer(benchmarks.app, name="benchmarks")
app.add_typer(tasks.app, name="tasks")
app.add_typer(runs.app, name="run")
app.add_typer(agents.app, name="agents")
app.add_typer(analyses_cli.labels_app, name="labels")


def main() -> None:
    from kit.file_errors import FileError

    try:
        app()
    except FileError as err:  # a mistake in an operator's file: one paragraph, no traceback
        print_error(err)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
