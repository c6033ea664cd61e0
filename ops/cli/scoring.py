"""``rsigym score RUN`` (end, audit, then score a run's final submission) and ``rsigym report``
(the RSI-Index from every finished score)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from kit.display_text import PlainTable, inert
from ops.cli.admin_client import AdminClient, AdminError
from ops.cli.audits import run_audit
from ops.cli.common import (
    DataDirOpt,
    JsonOpt,
    PollOpt,
    UrlOpt,
    console,
    err_console,
    print_error,
    print_note,
    with_admin,
)
from services.evaluation.decompose import decomposition_view, decompositions_of
from services.evaluation.report import FINAL_SCORE_STATUSES as FINAL
from services.evaluation.report import build_report_rows
from services.evaluation.report import to_json as to_report_json
from services.evaluation.schemas import BASELINE_RUNS, REFERENCE_RUN


def _score_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _subset_text(r: dict[str, Any]) -> str:
    return "all" if r.get("subset") is None else f"{r['subset']} (seed {r.get('subset_seed')})"


def _scores_table(rows: list[dict[str, Any]]) -> Table:
    table = PlainTable("score id", "run", "benchmark", "split", "subset", "split seed", "model", "harness", "attempts",
                       "status", "progress", "score")
    for r in rows:
        p = r.get("progress") or {}
        progress = f"{p.get('done', 0)}/{p.get('total', 0)}" if p else "-"
        table.add_row(r["id"], r["run_id"], r["benchmark"], r["split"], _subset_text(r), r.get("split_seed") or "fixed",
                      r["model"], r["harness"], str(r["attempts"]), r["status"], progress, _score_text(r.get("score")))
    return table


def _scope_of(r: dict[str, Any]) -> tuple[Any, ...]:
    """What a score was taken on: initial and reference records are watched on the run's scope."""
    return r["benchmark"], r["split"], r["attempts"], r.get("subset"), r.get("subset_seed"), r.get("split_seed")


def watched_records(started: list[dict[str, Any]], scores: list[dict[str, Any]], run_id: str,
                    reference: str | None = None) -> list[dict[str, Any]]:
    """The score records ``rsigym score RUN --wait`` waits for: the ones just started, and the
    initial system's (and the ``reference`` model's) records on the same scope (benchmark, split,
    attempts, subset, seeds): a baseline that was already cached is not in ``started``."""
    ids = {r["id"] for r in started}
    wanted = {_scope_of(r) for r in started if r["run_id"] == run_id}
    return [r for r in scores if r["id"] in ids
            or (r["run_id"] in BASELINE_RUNS and _scope_of(r) in wanted
                and (r["run_id"] != REFERENCE_RUN or r["model"] == reference))]


def _wait_for_scores(started: list[dict[str, Any]], run_id: str, poll: float, data_dir: Path | None,
                     url: str | None, reference: str | None = None) -> list[dict[str, Any]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bars: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), console=err_console) as progress:
        while True:
            watched = watched_records(started, with_admin(data_dir, url, lambda c: c.scores()), run_id, reference)
            for r in watched:
                p = r.get("progress") or {}
                if r["id"] not in bars:
                    subset = "" if r.get("subset") is None else f" subset {r['subset']}@seed {r.get('subset_seed')}"
                    label = f"{r['run_id']} {r['benchmark']}/{r['split']}{subset} avg@{r['attempts']}"
                    bars[r["id"]] = progress.add_task(escape(inert(label)), total=p.get("total") or None, status="")
                progress.update(bars[r["id"]], completed=p.get("done", 0), total=p.get("total") or None,
                                status=escape(inert(f"{r['status']} {_score_text(r.get('score'))}")))
            if all(r["status"] in FINAL for r in watched):
                return watched
            time.sleep(poll)


def score(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run (its root key id) to score.")],
    attempts: Annotated[int, typer.Option("--attempts", min=1, max=10, help="Attempts per task (avg@k).")] = 3,
    benchmark: Annotated[list[str] | None, typer.Option("--benchmark", help="Only this benchmark (repeatable).")] = None,
    split: Annotated[str, typer.Option("--split", help="The split scored (hidden from agents).")] = "official",
    subset: Annotated[int | None, typer.Option("--subset", min=1, help="Score N tasks of the split, drawn by --seed "
                                                                     "(the same N for the initial system and every run)."
                                               )] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0, help="The subset's seed (required with --subset; "
                                                                   "named in the scores and the report).")] = None,
    reference: Annotated[str | None, typer.Option("--reference", metavar="MODEL", help="Also score this base model "
                                                  "with the minimal harness (the gap to reference; not in the "
                                                  "RSI-Index).")] = None,
    decompose: Annotated[bool, typer.Option("--decompose", help="Also score the submitted model with the minimal "
                                            "harness and the base model with the submitted harness, and report the "
                                            "weights' and the harness's contributions with their intervals (with "
                                            "--wait).")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the run's and the initial system's "
                                                      "scores are final (exit 1 if one failed).")] = False,
    poll: PollOpt = 2.0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """End the run if it is open, audit its final submission, then score that submission (avg@k
    on the official split of every ready benchmark).

    The final submission is the run's latest before it ended: an open run is ended first
    (deadline now: its keys are refused with run_ended, submissions closed), so the audited
    submission is the scored one. Billed to the operator's own key, not the run's. The initial
    system (base model + minimal harness) is scored the same way once per benchmark, split and
    attempts, and cached. The submission is scored on a visible split (dev) as well, and with
    --wait the run is audited again once the scores are in: the audit's score-gap check flags an
    official score that beats the dev score by more than sampling noise.

    --subset N --seed S scores a seeded subset of N tasks of each benchmark's split instead
    (services/evaluation/subsets.py): the same tasks for the initial system, the --reference
    model and every run scored with that N and seed; each score names its subset, subset seed
    and split seed. The dev score for the score-gap check stays on the whole dev split.

    --decompose also scores the submitted model with the minimal harness and the base model with
    the submitted harness on the same scope, and (with --wait) prints the four cells and where the
    gain came from: the weights' and the harness's contributions and their interaction, each with
    a paired bootstrap 95% interval over tasks and within_noise (services/evaluation/decompose.py).
    A submission that kept the base model or the minimal harness is decomposed trivially (said so;
    nothing more scored)."""
    shown = err_console if as_json else console
    if (subset is None) != (seed is None):
        print_error("give --subset N and --seed S together: the seed that draws the subset is named in every report")
        raise typer.Exit(2)
    if with_admin(data_dir, url, lambda c: c.latest_submission(run_id)) is None:
        print_error(f"run {run_id} has submitted nothing: nothing scored, the run left as it is")
        raise typer.Exit(1)
    ended = with_admin(data_dir, url, lambda c: end_open_run(c, run_id))
    if ended is not None:
        shown.print(f"run {run_id} was open: ended it now ({ended}); its keys are refused (run_ended) and its "
                    "submissions closed, so its latest submission is final")
    verdict = run_audit(run_id, trajectory=None, data_dir=data_dir, url=url)  # every score comes with its audit
    submission_id = (verdict.get("submission") or {}).get("id")
    shown.print(f"audit of {run_id}'s final submission {escape(inert(str(submission_id)))}: "
                f"[bold]{verdict['status']}[/bold] (`rsigym audit {run_id}` for the findings)")
    started = with_admin(data_dir, url, lambda c: c.score(run_id, attempts=attempts, benchmarks=benchmark, split=split,
                                                      submission_id=submission_id, subset=subset, subset_seed=seed,
                                                      reference=reference, decompose=decompose))
    # The score-gap check compares the official score with the same system's dev score.
    started_dev = with_admin(data_dir, url, lambda c: score_visible_splits(c, run_id, attempts, benchmark, split,
                                                                        submission_id))
    watched = (_wait_for_scores(started + started_dev, run_id, poll, data_dir, url, reference) if wait
               else started + started_dev)
    rows = [r for r in watched if r["split"] == split]
    after = run_audit(run_id, trajectory=None, data_dir=data_dir, url=url) if wait else None
    if after is not None:
        shown.print(f"audit of {run_id} with its scores (score gap): [bold]{after['status']}[/bold]")
    decomposition = (with_admin(data_dir, url, lambda c: decomposition_view(c.scores(), run_id, c.evaluation_results,
                                                                             split=split))
                     if decompose and wait else None)
    if as_json:
        typer.echo(json.dumps({"data": rows, "audit": {"status": verdict["status"],
                                                       "hacking_rate": verdict["hacking_rate"],
                                                       "audit_id": verdict.get("audit_id"),
                                                       "submission_id": submission_id},
                               "run_ended_now": ended is not None,
                               "subset": None if subset is None else {"size": subset, "seed": seed},
                               "reference": reference,
                               "dev_scores": [r for r in watched if r["split"] != split],
                               "comparisons": with_admin(data_dir, url, lambda c: score_comparisons(c, rows, run_id)),
                               "rsi_index": (with_admin(data_dir, url, lambda c: run_indices(c, run_id, split))
                                             if wait else None),
                               "audit_after_scoring": None if after is None else {
                                   "status": after["status"], "hacking_rate": after["hacking_rate"],
                                   "audit_id": after.get("audit_id")},
                               **({"decomposition": decomposition} if decompose else {})}, indent=2))
    else:
        console.print(_scores_table(watched))
        if decomposition is not None:
            _print_decomposition(decomposition)
        if not wait:
            err_console.print(f"scoring started; `rsigym score {run_id} --wait` or `rsigym report` when it is done "
                              f"(`rsigym audit {run_id}` then checks the official score against the dev score)")
    if wait and any(r["status"] != "succeeded" for r in watched):
        raise typer.Exit(1)


def _baseline_systems(record: dict[str, Any]) -> list[tuple[str, tuple[str, str] | None]]:
    """What a run's score is compared with: its initial system (``initial``; the one its record
    names, else any minimal-harness initial score of the scope, as before generations) and, for a
    run started ``--from`` an earlier run, generation 0 (``generation_0``: base model + minimal)."""
    named = record.get("initial_system")
    out: list[tuple[str, tuple[str, str] | None]] = [("initial", (named["model"], named["harness"]) if named else None)]
    generation = record.get("generation")
    if generation:
        out.append(("generation_0", (generation["base_model"], "minimal")))
    return out


def score_comparisons(client: AdminClient, rows: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The submission vs the initial system per benchmark (and, for a later generation, vs
    generation 0 too), once both scores succeeded: the paired bootstrap of
    services/evaluation/bootstrap.py over the two jobs' trials (``ci95``, ``within_noise``)."""
    from services.evaluation.bootstrap import paired_bootstrap, task_rewards
    from services.evaluation.schemas import INITIAL_RUN

    done = [r for r in rows if r["status"] == "succeeded" and not r.get("cell")]
    out = []
    for run in (r for r in done if r["run_id"] == run_id):
        for vs, system in _baseline_systems(run):
            base = next((i for i in done if i["run_id"] == INITIAL_RUN and _scope_of(i) == _scope_of(run)
                         and ((i["model"], i.get("harness") or "minimal") == system if system
                              else (i.get("harness") or "minimal") == "minimal")), None)
            if base is None:
                continue
            initial, submitted = (task_rewards((t["task_id"], t.get("reward"))
                                               for t in client.evaluation_results(r["job_id"])) for r in (base, run))
            try:
                c = paired_bootstrap(initial, submitted)
            except ValueError as err:  # not the same tasks (or none): no paired interval
                print_note(f"{run['benchmark']}: no interval vs {vs.replace('_', ' ')} ({err})")
                continue
            out.append({"benchmark": run["benchmark"], "split": run["split"], "vs": vs,
                        "model": base["model"], "harness": base.get("harness"), "initial": c.a,
                        "submitted": c.b, "diff": c.diff, "ci95": list(c.ci95), "within_noise": c.within_noise,
                        "tasks": c.tasks, "method": c.to_json()["method"], "resamples": c.resamples, "seed": c.seed})
    return out


def run_indices(client: AdminClient, run_id: str, split: str) -> dict[str, Any] | None:
    """The run's RSI-Index with its interval (``rsigym score RUN --wait --json``) and, for a run
    started ``--from`` an earlier run, its generation and both indices (vs its initial system, vs
    generation 0): the report's own numbers for this one run. None: not scored to the end yet."""
    from services.evaluation.report import build_report, group_rows, report_jobs

    rows, _ = build_report_rows(client.scores(), [client.key(run_id)], split)
    rows = [r for r in rows if r.run_id == run_id]
    if not rows:
        return None
    report = build_report(group_rows(rows), trials=_job_trials(client, report_jobs(rows)))
    (run,) = [r for r in to_report_json(report)["runs"] if r["run_id"] == run_id]
    return {"rsi_index": run["rsi_index"], "ci95": run["ci95"], "within_noise": run["within_noise"],
            "generation": run["generation"]}


def _interval_text(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    low, high = c["ci95"]
    return f"{c['estimate']:+.4f} [{low:+.4f}, {high:+.4f}]" + (" within noise" if c["within_noise"] else "")


def _print_decomposition(views: list[dict[str, Any]]) -> None:
    """``--decompose``: the four cells' scores and the contributions with their 95% intervals."""
    if not views:
        err_console.print("no decomposition: no succeeded score of the run with its initial system on this split")
    for v in views:
        title = escape(inert(f"{v['benchmark']}/{v['split']}: model × harness"))
        table = PlainTable("cell", "model", "harness", "score", title=title)
        for name, cell in v["cells"].items():
            table.add_row(name, cell["model"], cell["harness"], _score_text(cell.get("score")))
        console.print(table)
        contributions = v.get("contributions") or {}
        parts = PlainTable("part", "estimate [95% interval]", title=f"where the gain came from ({v['status']}; "
                                                                    f"{v.get('tasks')} tasks)")
        parts.add_row("gain", _interval_text(v.get("gain")))
        for name in ("weights", "harness", "interaction"):
            parts.add_row(name, _interval_text(contributions.get(name)))
        console.print(parts)
        if v.get("note"):
            print_note(str(v["note"]))


def score_visible_splits(client: AdminClient, run_id: str, attempts: int, benchmarks: list[str] | None, split: str,
                         submission_id: str | None) -> list[dict[str, Any]]:
    """Score the submission on a visible split (``dev`` where there is one) of every benchmark
    whose ``split`` is hidden, for the audit's score-gap check (services/records/audits/score_gap.py)."""
    by_split: dict[str, list[str]] = {}
    for b in client.benchmarks():
        splits = b.get("splits") or {}
        if b.get("status") != "ready" or (benchmarks and b["name"] not in benchmarks) \
                or not (splits.get(split) or {}).get("hidden"):
            continue
        visible = [n for n, info in splits.items() if not (info or {}).get("hidden")]
        if visible:
            by_split.setdefault("dev" if "dev" in visible else visible[0], []).append(b["name"])
    return [row for name, names in by_split.items()
            for row in client.score(run_id, attempts=attempts, benchmarks=names, split=name, submission_id=submission_id)]


def end_open_run(client: AdminClient, run_id: str) -> str | None:
    """End the run now if its deadline is unset or ahead (the deadline route, ``deadline_s`` 0);
    the new deadline, or None when the run had already ended (its deadline is left as it was)."""
    ends_at = client.key(run_id).get("ends_at")
    if ends_at is not None and datetime.fromisoformat(ends_at) <= datetime.now(UTC):
        return None
    return str(client.set_deadline(run_id, 0).get("ends_at"))


def report(
    out: Annotated[Path, typer.Option("--out", help="Directory for report.md, report.json and charts.")] = Path(
        "rsigym-report"),
    split: Annotated[str, typer.Option("--split", help="The split whose scores are reported.")] = "official",
    include_flagged: Annotated[bool, typer.Option("--include-flagged", help="Also give each agent's RSI-Index with "
                                                  "its flagged runs (left out of it by default).")] = False,
    chain: Annotated[str | None, typer.Option("--chain", metavar="RUN", help="Draw only RUN's chain of generations "
                                              "back to generation 0 (every chain of two or more generations among "
                                              "the reported runs is drawn by default).")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """The RSI-Index per run and per agent, from every finished score.

    Each run's integrity is its newest audit's verdict (or "not audited"); its timeline (time to
    first training job, research hours, experiments, spend) goes into the files, with the spend
    by service over time drawn as timeline-<run>.png.

    Every comparison comes with its 95% interval and within_noise (a paired bootstrap over the
    scoring jobs' trials, seeded: services/evaluation/bootstrap.py). Flagged runs are left out of an
    agent's RSI-Index and listed apart (--include-flagged adds the index with them); runs of one
    agent on one task, track and budget are grouped, with their mean index and its t-interval.

    A run started --from an earlier run (a later generation) gets its RSI-Index against its own
    initial system and against generation 0 (base model + minimal harness), both with intervals.
    Each chain of generations among the reported runs (or only RUN's, with --chain RUN) is drawn
    back to generation 0: a table of the official score by generation per benchmark and
    chain-<run>.png, with each score's 95% bootstrap interval as error bars.

    Prints the tables and writes report.md, report.json, one PNG chart per benchmark, one
    timeline chart per run and one chain chart per chain into --out; --json prints report.json's
    content instead of the tables."""
    from services.evaluation.generations import build_chain, chain_ends
    from services.evaluation.report import group_rows, report_jobs, scored_submissions, to_json, write_report

    scores, keys = with_admin(data_dir, url, lambda c: (c.scores(), c.keys()))
    rows, notes = build_report_rows(scores, keys, split)
    for note in notes:
        print_note(note)
    if not rows:
        err_console.print("no scored runs with an initial-system score yet: `rsigym score RUN --wait` first")
        raise typer.Exit(1)
    grouped = group_rows(rows)
    if chain is not None and chain not in {r.run_id for r in grouped}:
        print_error(f"--chain {chain}: the run has no finished {split} score with an initial-system score")
        raise typer.Exit(1)
    chains = [build_chain(scores, run, split=split)
              for run in ([chain] if chain is not None else chain_ends(scores, [r.run_id for r in grouped]))]
    audits, timelines, integrity_default = with_admin(
        data_dir, url, lambda c: _report_records(c, [r.run_id for r in grouped], scored_submissions(rows)))
    jobs = list(dict.fromkeys([*report_jobs(rows), *(j for c in chains for j in c.jobs())]))
    trials = with_admin(data_dir, url, lambda c: _job_trials(c, jobs))
    decompositions = with_admin(data_dir, url, lambda c: decompositions_of(  # `rsigym score --decompose`'s
        scores, [r.run_id for r in grouped], c.evaluation_results, split=split))
    files = write_report(grouped, out, err_console if as_json else console, audits=audits, timelines=timelines,
                         integrity_default=integrity_default, trials=trials, include_flagged=include_flagged,
                         decompositions=decompositions, chains=chains)
    if as_json:
        typer.echo(json.dumps(to_json(files.report), indent=2))
    else:
        written = [files.markdown, files.json, *files.charts.values(), *files.timeline_charts.values(),
                   *files.chain_charts.values()]
        console.print("written: " + ", ".join(str(p) for p in written))
    from ops.cli.analyses import report_analyses  # the papers' analyses next to report.md (ops/analyses/)
    report_analyses(out, [r.run_id for r in grouped], as_json=as_json, data_dir=data_dir, url=url)


def _job_trials(client: AdminClient, job_ids: list[str]) -> dict[str, dict[str, list[float]]]:
    """Each job's rewards by task, for the report's intervals; a job whose trials cannot be read is
    named on stderr and its comparisons left without an interval."""
    from services.evaluation.bootstrap import task_rewards

    out = {}
    for job_id in job_ids:
        try:
            out[job_id] = task_rewards((t["task_id"], t.get("reward")) for t in client.evaluation_results(job_id))
        except AdminError as err:
            print_note(f"trials of {job_id} could not be read ({err.type}: {err.message}); no interval from them")
    return out


def _report_records(client: AdminClient, run_ids: list[str],
                    scored: dict[str, set[str | None]]) -> tuple[Any, list[Any], str]:
    """The runs' newest audits of their scored submissions and their timelines for `rsigym report`.
    A part that cannot be read is named on stderr and left out: integrity then reads "unknown",
    never "not audited"."""
    from services.evaluation.report import INTEGRITY_UNKNOWN, NOT_AUDITED, newest_audits, timeline_from_api

    try:
        records = client.audits()
        audits, default = newest_audits(records, scored), NOT_AUDITED
        for run_id in sorted(set(newest_audits(records)) & set(run_ids) - set(audits)):
            print_note(f"{run_id}: no audit of its scored submission ({', '.join(sorted(map(str, scored.get(run_id, ()))))}"
                  f"); integrity shown as {NOT_AUDITED} (`rsigym score {run_id}` audits what it scores)")
    except AdminError as err:
        print_note(f"audits could not be read ({err.type}: {err.message}); integrity shown as unknown")
        audits, default = {}, INTEGRITY_UNKNOWN
    timelines = []
    for run_id in run_ids:
        try:
            timelines.append(timeline_from_api(client.timeline(run_id)))
        except AdminError as err:
            print_note(f"no timeline for {run_id} ({err.type}: {err.message})")
    return audits, timelines, default
