"""``gym eval …`` (benchmarks and evaluation jobs), ``gym harness …`` (harness archives) and
``gym submit`` (the run's result for scoring)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .._client import Gym
from ..resources.evaluation import MINIMAL_HARNESS
from ..types import EvaluationJob, Harness
from .arguments import add_json, positive_int
from .output import dump, echo, echo_err, format_score, print_json, print_table


def _eval_benchmarks(gym: Gym, args: argparse.Namespace) -> None:
    benchmarks = gym.evaluation.benchmarks()
    if args.json:
        print_json([dump(b) for b in benchmarks])
        return
    if not benchmarks:
        echo("no benchmarks")
        return
    rows = [["NAME", "VERSION", "STATUS", "SPLITS (tasks)"]]
    for b in benchmarks:
        splits = ", ".join(f"{name} ({split.tasks})" for name, split in b.splits.items())
        rows.append([b.name, b.version or "-", b.status or "-", splits or "-"])
    print_table(rows)


def _progress_text(job: EvaluationJob) -> str:
    return f"{job.id}: {job.status} {job.progress.done}/{job.progress.total} trials"


def _final_text(job: EvaluationJob) -> str:
    text = f"{job.id}: {job.status}, score {format_score(job.score)} ({job.benchmark}/{job.split}, avg@{job.attempts})"
    return text + (f" - {job.error}" if job.error else "")


def _wait_job(gym: Gym, job: EvaluationJob, args: argparse.Namespace) -> int:
    report = None if args.json else (lambda j: echo_err(_progress_text(j)))
    job = gym.evaluation.wait(job.id, poll_s=args.poll, on_progress=report)
    if args.json:
        print_json(dump(job))
    else:
        echo(_final_text(job))
    return 0 if job.status == "succeeded" else 1


def _eval_run(gym: Gym, args: argparse.Namespace) -> int:
    sampling = {key: value for key, value in (("temperature", args.temperature), ("top_p", args.top_p),
                                              ("max_tokens", args.max_tokens), ("seed", args.seed)) if value is not None}
    job = gym.evaluation.run(args.benchmark, args.model, split=args.split, harness=args.harness,
                             attempts=args.attempts, sampling=sampling or None, tasks=args.task, limit=args.limit,
                             experiment=args.experiment)
    if args.wait:
        if not args.json:
            echo(job.id)
        return _wait_job(gym, job, args)
    if args.json:
        print_json(dump(job))
        return 0
    echo(job.id)
    echo_err(f"evaluation job {job.id} queued: {job.tasks} tasks x {job.attempts} attempts; "
         f"`gym eval status {job.id}` shows its progress")
    return 0


def _eval_ls(gym: Gym, args: argparse.Namespace) -> None:
    jobs = gym.evaluation.jobs()
    if args.json:
        print_json([dump(j) for j in jobs])
        return
    if not jobs:
        echo("no evaluation jobs")
        return
    rows = [["ID", "BENCHMARK", "SPLIT", "MODEL", "HARNESS", "STATUS", "PROGRESS", "SCORE"]]
    for j in jobs:
        rows.append([j.id, j.benchmark, j.split, j.model, j.harness, j.status,
                     f"{j.progress.done}/{j.progress.total}", format_score(j.score)])
    print_table(rows)


def _eval_status(gym: Gym, args: argparse.Namespace) -> None:
    job = gym.evaluation.get(args.id)
    if args.json:
        print_json(dump(job))
        return
    rows = [
        ["id", job.id], ["status", job.status], ["benchmark", f"{job.benchmark}/{job.split}"], ["model", job.model],
        ["harness", job.harness], ["attempts", str(job.attempts)], ["tasks", str(job.tasks)],
        ["progress", f"{job.progress.done}/{job.progress.total} trials"], ["score", format_score(job.score)],
        ["detail", job.detail or "-"], ["created", job.created_at.isoformat() if job.created_at else "-"],
        ["finished", job.finished_at.isoformat() if job.finished_at else "-"],
    ]
    if job.sampling:
        rows.append(["sampling", json.dumps(job.sampling, sort_keys=True)])
    if job.error:
        rows.append(["error", job.error])
    print_table(rows)


def _eval_results(gym: Gym, args: argparse.Namespace) -> None:
    results = gym.evaluation.results(args.id)
    if args.json:
        print_json([dump(r) for r in results])
        return
    if not results:
        echo("no results yet")
        return
    rows = [["TASK", "ATTEMPT", "REWARD", "ERROR"]]
    for r in results:
        error = (r.error or "").splitlines()[0][:80] if r.error else ""
        rows.append([r.task_id, str(r.attempt), format_score(r.reward), error])
    print_table(rows)
    rewards = [r.reward or 0.0 for r in results]
    echo_err(f"{len(results)} trials, mean reward {format_score(sum(rewards) / len(rewards))}")


def _eval_cancel(gym: Gym, args: argparse.Namespace) -> None:
    job = gym.evaluation.cancel(args.id)
    if args.json:
        print_json(dump(job))
        return
    echo(f"{job.id}: {job.status}" + ("" if job.done else " (cancel requested: running trials finish first)"))


def _harness_dict(harness: Harness) -> dict[str, Any]:
    return dump(harness)


def _harness_upload(gym: Gym, args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        echo_err(f"error: {path} does not exist")
        return 1
    try:
        harness = gym.evaluation.upload_harness(path)
    except (ValueError, OSError) as exc:  # a directory that cannot be archived, an unreadable file
        echo_err(f"error: {exc}")
        return 1
    if args.json:
        print_json(_harness_dict(harness))
        return 0
    echo(harness.id)
    echo_err(f"harness {harness.name!r} uploaded: {harness.files} files, {harness.bytes} bytes, sha256 {harness.sha256[:12]}…")
    return 0


def _harness_ls(gym: Gym, args: argparse.Namespace) -> None:
    harnesses = gym.evaluation.harnesses()
    if args.json:
        print_json([_harness_dict(h) for h in harnesses])
        return
    if not harnesses:
        echo("no harnesses uploaded (the built-in one is 'minimal')")
        return
    rows = [["ID", "NAME", "FILES", "BYTES", "SHA256", "CREATED"]]
    for h in harnesses:
        created = h.created_at.strftime("%Y-%m-%d %H:%M:%S") if h.created_at else "-"
        rows.append([h.id, h.name, str(h.files), str(h.bytes), h.sha256[:12], created])
    print_table(rows)


def _submit(gym: Gym, args: argparse.Namespace) -> None:
    submission = gym.submit(checkpoint=args.checkpoint, harness=args.harness, base_model=args.base_model)
    if args.json:
        print_json(dump(submission))
        return
    echo(submission.id)
    echo_err(f"submitted ({submission.track or 'no'} track): model {submission.model}, harness {submission.harness}; "
         "your latest submission before the run ends is the one audited and scored")


def add_commands(services: Any) -> None:
    evaluation = services.add_parser("eval", help="evaluation: benchmarks and evaluation jobs")
    verbs = evaluation.add_subparsers(dest="verb", metavar="<verb>", required=True)
    benchmarks = verbs.add_parser("benchmarks", help="list the benchmarks and their splits")
    add_json(benchmarks)
    benchmarks.set_defaults(handler=_eval_benchmarks)
    run = verbs.add_parser("run", help="start an evaluation job and print its id",
                           description="Evaluates MODEL with a harness on a benchmark split. Trials run in "
                                       "sandboxes and call the model through the gym: both are charged to the run.")
    run.add_argument("--benchmark", required=True, metavar="B")
    run.add_argument("--model", required=True, metavar="M", help="a base model or one of this run's checkpoints")
    run.add_argument("--split", default="dev", help="default: dev")
    run.add_argument("--harness", default=MINIMAL_HARNESS, metavar="minimal|ID",
                     help="'minimal' (default) or an uploaded harness id")
    run.add_argument("--attempts", type=positive_int, default=1, metavar="N", help="attempts per task (avg@N)")
    run.add_argument("--limit", type=positive_int, metavar="N", help="only the split's first N tasks")
    run.add_argument("--task", action="append", metavar="ID", help="only this task (repeatable)")
    run.add_argument("--experiment", metavar="EXP", help="attach to this experiment of yours (default: the one "
                                                          "that produced the checkpoint, or a new implicit one)")
    run.add_argument("--temperature", type=float)
    run.add_argument("--top-p", type=float, dest="top_p")
    run.add_argument("--max-tokens", type=int, dest="max_tokens")
    run.add_argument("--seed", type=int)
    run.add_argument("--wait", action="store_true", help="show progress until the job ends, then its score")
    run.add_argument("--poll", type=float, default=2.0, metavar="S", help="seconds between polls with --wait")
    add_json(run)
    run.set_defaults(handler=_eval_run)
    ls = verbs.add_parser("ls", help="this run's evaluation jobs")
    add_json(ls)
    ls.set_defaults(handler=_eval_ls)
    status = verbs.add_parser("status", help="a job's status, progress and score")
    status.add_argument("id", metavar="ID")
    add_json(status)
    status.set_defaults(handler=_eval_status)
    results = verbs.add_parser("results", help="a job's per-trial results (rewards; --json: trajectories too)")
    results.add_argument("id", metavar="ID")
    add_json(results)
    results.set_defaults(handler=_eval_results)
    cancel = verbs.add_parser("cancel", help="cancel a job (finished trials keep their results)")
    cancel.add_argument("id", metavar="ID")
    add_json(cancel)
    cancel.set_defaults(handler=_eval_cancel)

    harness = services.add_parser("harness", help="harness archives for evaluation")
    harness_verbs = harness.add_subparsers(dest="verb", metavar="<verb>", required=True)
    upload = harness_verbs.add_parser("upload", help="upload a harness and print its id",
                                      description="PATH is a .tar.gz with harness.toml at its root, or a directory "
                                                  "holding harness.toml (archived deterministically first).")
    upload.add_argument("path", metavar="PATH")
    add_json(upload)
    upload.set_defaults(handler=_harness_upload)
    harness_ls = harness_verbs.add_parser("ls", help="this run's uploaded harnesses")
    add_json(harness_ls)
    harness_ls.set_defaults(handler=_harness_ls)

    submit = services.add_parser("submit", help="submit the run's result for scoring (what the track asks for)",
                                 description="data track: --checkpoint; harness track: --harness (and optionally "
                                             "--base-model); joint track: both. You may submit again: the latest "
                                             "submission before the run ends is scored (scoring ends the run).")
    submit.add_argument("--checkpoint", metavar="C", help="a checkpoint id of this run")
    submit.add_argument("--harness", metavar="H", help="an uploaded harness id (or 'minimal')")
    submit.add_argument("--base-model", dest="base_model", metavar="M", help="the base model, when no checkpoint")
    add_json(submit)
    submit.set_defaults(handler=_submit)
