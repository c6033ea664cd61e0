"""``gym``: the agent's command line, a thin layer over :class:`~rsigym.Gym`.

::

    gym balance [--json]
    gym rollout models [--json]
    gym rollout chat --model M [--system S] [--max-tokens N] [--temperature T] [--stream] [--json] PROMPT
    gym keys mint [--name N] [--budget USD] [--policy-file F.json] [--json]
    gym keys list [--json]
    gym keys revoke ID [--json]
    gym sandbox create [--template T] [--timeout S] [--json]       prints the new sandbox's id
    gym sandbox run ID [--cwd D] [--env K=V]… [--timeout S] -- CMD…
    gym sandbox ls [--all] [--json]
    gym sandbox info ID [--json]
    gym sandbox kill ID
    gym eval benchmarks [--json]
    gym eval run --benchmark B --model M [--split dev] [--harness minimal|ID] [--attempts N] [--limit N]
                 [--experiment EXP]
                 [--task ID]… [--temperature T] [--top-p P] [--max-tokens N] [--seed S] [--wait] [--json]
    gym eval ls [--json]
    gym eval status ID [--json]
    gym eval results ID [--json]
    gym eval cancel ID [--json]
    gym harness upload PATH [--json]      PATH: a .tar.gz, or a directory (archived first); prints the id
    gym harness ls [--json]
    gym submit [--checkpoint C] [--harness H] [--base-model M] [--json]
    gym records events [--kind K] [--experiment ID] [--after SEQ] [--limit N] [--json]
    gym records experiments [--json]
    gym records experiment ID [--json]
    gym records new NAME [--parent ID]… [--note TEXT] [--json]      prints the new experiment's id
    gym records diff A B [--json]
    gym records lineage CKPT [--json]
    gym records best [--benchmark B] [--split dev] [--json]
    gym records annotate {hypothesis,finding,review} --json FILE    FILE: the annotation's fields (JSON object)
    gym records annotations [--kind K] [--experiment ID] [--json]
    gym records chain [--json]

Exit codes: 0 success, 1 an error from the gym or the network (printed to stderr as
``error: <type>: <message> (request_id …)``), 2 a usage error; ``sandbox run`` exits with
the command's own exit code (124 when its ``--timeout`` ran out); ``eval run --wait`` exits 1
when the job ends other than ``succeeded``. ``--json`` prints
machine-readable JSON on stdout. In plain mode ``chat`` prints the reply on stdout and
its cost / remaining budget on stderr, so the reply can be piped on its own.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._client import Gym
from ._version import __version__
from .errors import APITimeoutError, RSIGymError
from .resources.evaluation import MINIMAL_HARNESS
from .types import ChatCompletionChunk, ChildKey, EvaluationJob, Experiment, Harness, SandboxRecord

__all__ = ["main", "build_parser", "format_error", "format_usd"]

ClientFactory = Callable[[], Gym]


# ---- formatting -------------------------------------------------------------------


def format_usd(value: float | None) -> str:
    """Dollars with at least cents and at most micro-dollars: $5.00, $0.000123, -."""
    if value is None:
        return "-"
    whole, _, frac = f"{value:.6f}".partition(".")
    frac = frac.rstrip("0").ljust(2, "0")
    return f"-${whole.lstrip('-')}.{frac}" if value < 0 else f"${whole}.{frac}"


def format_error(err: RSIGymError) -> str:
    text = f"error: {err.type}: {err.message}"
    if err.request_id:
        text += f" (request_id {err.request_id})"
    return text


def _out(text: str = "") -> None:
    print(text, file=sys.stdout)


def _err(text: str) -> None:
    print(text, file=sys.stderr)


def _print_json(data: Any, *, compact: bool = False) -> None:
    _out(json.dumps(data, indent=None if compact else 2, ensure_ascii=False))


def _meta(obj: Any) -> dict[str, Any]:
    return {"request_id": obj.request_id, "cost_usd": obj.cost_usd, "remaining_usd": obj.remaining_usd}


def _cost_line(obj: Any) -> str:
    cost = f"cost {format_usd(obj.cost_usd)}"
    if getattr(obj, "cost_is_upper_bound", False):
        cost = f"cost <= {format_usd(obj.cost_usd)} (reserved)"
    parts = [cost, f"remaining {format_usd(obj.remaining_usd)}"]
    if obj.request_id:
        parts.append(f"request_id {obj.request_id}")
    return "[" + " | ".join(parts) + "]"


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        _out("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


# ---- commands -----------------------------------------------------------------------


def _balance(gym: Gym, args: argparse.Namespace) -> None:
    balance = gym.balance()
    if args.json:
        _print_json(balance.model_dump(mode="json"))
        return
    _out(
        f"remaining {format_usd(balance.remaining_usd)} of {format_usd(balance.budget_usd)} "
        f"(spent {format_usd(balance.spent_usd)}, reserved {format_usd(balance.reserved_usd)})"
    )


def _rollout_models(gym: Gym, args: argparse.Namespace) -> None:
    models = gym.rollout.models()
    if args.json:
        _print_json([model.model_dump(mode="json") for model in models])
        return
    if not models:
        _out("no models")
        return
    rows = []
    for model in models:
        prices = " ".join(f"{key}={value}" for key, value in (model.pricing or {}).items())
        rows.append([model.id, prices])
    _table(rows)


def _read_prompt(prompt: str) -> str:
    return sys.stdin.read() if prompt == "-" else prompt


def _rollout_chat(gym: Gym, args: argparse.Namespace) -> None:
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": _read_prompt(args.prompt)})
    params = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.stream:
        _stream_chat(gym, args, messages, params)
        return
    completion = gym.rollout.chat(model=args.model, messages=messages, **params)
    if args.json:
        _print_json({**completion.model_dump(mode="json"), "rsigym": _meta(completion)})
        return
    _out(completion.text)
    _err(_cost_line(completion))


def _stream_chat(gym: Gym, args: argparse.Namespace, messages: list[dict[str, str]], params: dict[str, Any]) -> None:
    """Plain: the text as it arrives. JSON: one chunk per line, then ``{"rsigym": meta}``.

    Usage is requested so the final chunk carries the exact cost (the headers of a
    stream only know the reserved upper bound).
    """
    params = {**params, "stream_options": {"include_usage": True}}
    with gym.rollout.chat(model=args.model, messages=messages, stream=True, **params) as stream:
        chunk: ChatCompletionChunk
        for chunk in stream:
            if args.json:
                _print_json(chunk.model_dump(mode="json"), compact=True)
            else:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    if args.json:
        _print_json({"rsigym": _meta(stream)}, compact=True)
    else:
        _out()
        _err(_cost_line(stream))


def _key_dict(key: ChildKey) -> dict[str, Any]:
    return key.model_dump(mode="json")


def _keys_mint(gym: Gym, args: argparse.Namespace) -> None:
    key = gym.keys.mint(name=args.name, policy=args.policy_file, budget_usd=args.budget)
    if args.json:
        _print_json(_key_dict(key))
        return
    _table(
        [
            ["id", key.id],
            ["name", key.name or "-"],
            ["budget", format_usd(key.budget_usd) if key.budget_usd is not None else "parent's"],
            ["key", key.key or "-"],
        ]
    )
    if key.key:
        _err("the key is shown only once: store it now")


def _keys_list(gym: Gym, args: argparse.Namespace) -> None:
    keys = gym.keys.list()
    if args.json:
        _print_json([_key_dict(key) for key in keys])
        return
    if not keys:
        _out("no child keys")
        return
    rows = [["ID", "NAME", "STATUS", "BUDGET", "SPENT"]]
    for key in keys:
        rows.append([key.id, key.name or "-", key.status or "-", format_usd(key.budget_usd), format_usd(key.spent_usd)])
    _table(rows)


def _keys_revoke(gym: Gym, args: argparse.Namespace) -> None:
    key = gym.keys.revoke(args.id)
    if args.json:
        _print_json(_key_dict(key))
        return
    _out(f"{key.id}: {key.status or 'revoked'}")


def _sandbox_create(gym: Gym, args: argparse.Namespace) -> None:
    sbx = gym.sandbox.create(args.template, timeout=args.timeout)
    if args.json:
        _print_json({"id": sbx.id, "template": sbx.template})
        return
    _out(sbx.id)
    _err(f"sandbox {sbx.id} ({sbx.template}) is running; `gym sandbox kill {sbx.id}` ends it")


def _sandbox_command(words: list[str]) -> str:
    """One word is a shell command line as written; several are quoted to stay separate words."""
    return words[0] if len(words) == 1 else shlex.join(words)


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _write_now(stream: Any) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


def _sandbox_run(gym: Gym, args: argparse.Namespace) -> int:
    sbx = gym.sandbox.connect(args.id)
    try:
        result = sbx.run(_sandbox_command(args.command), envs=dict(args.env or []), cwd=args.cwd,
                         timeout=args.timeout, on_stdout=_write_now(sys.stdout), on_stderr=_write_now(sys.stderr))
    except APITimeoutError as err:
        if args.timeout is None:
            raise
        _err(format_error(err))
        return 124
    code = result.exit_code
    if code < 0 and not (result.status or "").startswith("signal"):  # e.g. the sandbox itself ended
        _err(f"error: {result.status or 'the command ended abnormally'} (see `gym sandbox info {args.id}`)")
        return 1
    return 128 - code if code < 0 else code & 0xFF  # killed by signal N (code -N): 128 + N, as shells do


def _record_dict(record: SandboxRecord) -> dict[str, Any]:
    return record.model_dump(mode="json")


def _sandbox_ls(gym: Gym, args: argparse.Namespace) -> None:
    records = gym.sandbox.list(state=None if args.all else "running")
    if args.json:
        _print_json([_record_dict(r) for r in records])
        return
    if not records:
        _out("no sandboxes" if args.all else "no running sandboxes")
        return
    rows = [["ID", "TEMPLATE", "STATE", "SECONDS", "COST", "STARTED"]]
    for r in records:
        started = r.started_at.strftime("%Y-%m-%d %H:%M:%S") if r.started_at else "-"
        rows.append([r.id, r.template, r.state, f"{r.seconds:.1f}", format_usd(r.cost_usd), started])
    _table(rows)


def _sandbox_info(gym: Gym, args: argparse.Namespace) -> None:
    record = gym.sandbox.get(args.id)
    if args.json:
        _print_json(_record_dict(record))
        return
    end = record.end_at if record.running else record.ended_at
    rows = [
        ["id", record.id], ["template", record.template], ["state", record.state],
        ["end reason", record.end_reason or "-"], ["internet", "yes" if record.internet else "no"],
        ["started", record.started_at.isoformat() if record.started_at else "-"],
        ["ends" if record.running else "ended", end.isoformat() if end else "-"],
        ["seconds", f"{record.seconds:.1f}"], ["cost", format_usd(record.cost_usd)],
        ["price", f"{format_usd(record.usd_per_hour)}/h"],
    ]
    rows += [[f"metadata.{k}", v] for k, v in record.metadata.items()]
    _table(rows)


def _sandbox_kill(gym: Gym, args: argparse.Namespace) -> None:
    if gym.sandbox.kill(args.id):
        _out(f"{args.id}: killed")
    else:
        _out(f"{args.id}: not running")


# ---- evaluation -----------------------------------------------------------------------


def format_score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(mode="json")


def _eval_benchmarks(gym: Gym, args: argparse.Namespace) -> None:
    benchmarks = gym.evaluation.benchmarks()
    if args.json:
        _print_json([_dump(b) for b in benchmarks])
        return
    if not benchmarks:
        _out("no benchmarks")
        return
    rows = [["NAME", "VERSION", "STATUS", "SPLITS (tasks)"]]
    for b in benchmarks:
        splits = ", ".join(f"{name} ({split.tasks})" for name, split in b.splits.items())
        rows.append([b.name, b.version or "-", b.status or "-", splits or "-"])
    _table(rows)


def _progress_text(job: EvaluationJob) -> str:
    return f"{job.id}: {job.status} {job.progress.done}/{job.progress.total} trials"


def _final_text(job: EvaluationJob) -> str:
    text = f"{job.id}: {job.status}, score {format_score(job.score)} ({job.benchmark}/{job.split}, avg@{job.attempts})"
    return text + (f" - {job.error}" if job.error else "")


def _wait_job(gym: Gym, job: EvaluationJob, args: argparse.Namespace) -> int:
    report = None if args.json else (lambda j: _err(_progress_text(j)))
    job = gym.evaluation.wait(job.id, poll_s=args.poll, on_progress=report)
    if args.json:
        _print_json(_dump(job))
    else:
        _out(_final_text(job))
    return 0 if job.status == "succeeded" else 1


def _eval_run(gym: Gym, args: argparse.Namespace) -> int:
    sampling = {key: value for key, value in (("temperature", args.temperature), ("top_p", args.top_p),
                                              ("max_tokens", args.max_tokens), ("seed", args.seed)) if value is not None}
    job = gym.evaluation.run(args.benchmark, args.model, split=args.split, harness=args.harness,
                             attempts=args.attempts, sampling=sampling or None, tasks=args.task, limit=args.limit,
                             experiment=args.experiment)
    if args.wait:
        if not args.json:
            _out(job.id)
        return _wait_job(gym, job, args)
    if args.json:
        _print_json(_dump(job))
        return 0
    _out(job.id)
    _err(f"evaluation job {job.id} queued: {job.tasks} tasks x {job.attempts} attempts; "
         f"`gym eval status {job.id}` shows its progress")
    return 0


def _eval_ls(gym: Gym, args: argparse.Namespace) -> None:
    jobs = gym.evaluation.jobs()
    if args.json:
        _print_json([_dump(j) for j in jobs])
        return
    if not jobs:
        _out("no evaluation jobs")
        return
    rows = [["ID", "BENCHMARK", "SPLIT", "MODEL", "HARNESS", "STATUS", "PROGRESS", "SCORE"]]
    for j in jobs:
        rows.append([j.id, j.benchmark, j.split, j.model, j.harness, j.status,
                     f"{j.progress.done}/{j.progress.total}", format_score(j.score)])
    _table(rows)


def _eval_status(gym: Gym, args: argparse.Namespace) -> None:
    job = gym.evaluation.get(args.id)
    if args.json:
        _print_json(_dump(job))
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
    _table(rows)


def _eval_results(gym: Gym, args: argparse.Namespace) -> None:
    results = gym.evaluation.results(args.id)
    if args.json:
        _print_json([_dump(r) for r in results])
        return
    if not results:
        _out("no results yet")
        return
    rows = [["TASK", "ATTEMPT", "REWARD", "ERROR"]]
    for r in results:
        error = (r.error or "").splitlines()[0][:80] if r.error else ""
        rows.append([r.task_id, str(r.attempt), format_score(r.reward), error])
    _table(rows)
    rewards = [r.reward or 0.0 for r in results]
    _err(f"{len(results)} trials, mean reward {format_score(sum(rewards) / len(rewards))}")


def _eval_cancel(gym: Gym, args: argparse.Namespace) -> None:
    job = gym.evaluation.cancel(args.id)
    if args.json:
        _print_json(_dump(job))
        return
    _out(f"{job.id}: {job.status}" + ("" if job.done else " (cancel requested: running trials finish first)"))


def _harness_dict(harness: Harness) -> dict[str, Any]:
    return _dump(harness)


def _harness_upload(gym: Gym, args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        _err(f"error: {path} does not exist")
        return 1
    try:
        harness = gym.evaluation.upload_harness(path)
    except (ValueError, OSError) as exc:  # a directory that cannot be archived, an unreadable file
        _err(f"error: {exc}")
        return 1
    if args.json:
        _print_json(_harness_dict(harness))
        return 0
    _out(harness.id)
    _err(f"harness {harness.name!r} uploaded: {harness.files} files, {harness.bytes} bytes, sha256 {harness.sha256[:12]}…")
    return 0


def _harness_ls(gym: Gym, args: argparse.Namespace) -> None:
    harnesses = gym.evaluation.harnesses()
    if args.json:
        _print_json([_harness_dict(h) for h in harnesses])
        return
    if not harnesses:
        _out("no harnesses uploaded (the built-in one is 'minimal')")
        return
    rows = [["ID", "NAME", "FILES", "BYTES", "SHA256", "CREATED"]]
    for h in harnesses:
        created = h.created_at.strftime("%Y-%m-%d %H:%M:%S") if h.created_at else "-"
        rows.append([h.id, h.name, str(h.files), str(h.bytes), h.sha256[:12], created])
    _table(rows)


def _submit(gym: Gym, args: argparse.Namespace) -> None:
    submission = gym.submit(checkpoint=args.checkpoint, harness=args.harness, base_model=args.base_model)
    if args.json:
        _print_json(_dump(submission))
        return
    _out(submission.id)
    _err(f"submitted ({submission.track or 'no'} track): model {submission.model}, harness {submission.harness}; "
         "your latest submission before the run ends is the one audited and scored")


# ---- records ------------------------------------------------------------------------


def _records_events(gym: Gym, args: argparse.Namespace) -> None:
    events = gym.records.events(kind=args.kind, experiment=args.experiment, after=args.after, limit=args.limit)
    if args.json:
        _print_json([_dump(e) for e in events])
        return
    if not events:
        _out("no events")
        return
    rows = [["SEQ", "KIND", "EXPERIMENT", "KEY", "CREATED"]]
    for e in events:
        created = e.created_at.strftime("%Y-%m-%d %H:%M:%S") if e.created_at else "-"
        rows.append([str(e.seq), e.kind, e.experiment_id or "-", e.key_id or "-", created])
    _table(rows)


def _experiment_row(x: Experiment) -> list[str]:
    scores = " ".join(f"{v.benchmark}/{v.split}={v.score:.3f}" for v in x.evaluations if v.score is not None)
    return [x.id, x.name, x.status, ",".join(x.parents) or "-", ",".join(x.theta_out.get("checkpoints") or []) or "-",
            scores or "-"]


def _records_experiments(gym: Gym, args: argparse.Namespace) -> None:
    experiments = gym.records.experiments.list()
    if args.json:
        _print_json([_dump(x) for x in experiments])
        return
    if not experiments:
        _out("no experiments")
        return
    _table([["ID", "NAME", "STATUS", "PARENTS", "CHECKPOINTS", "SCORES"], *map(_experiment_row, experiments)])


def _records_experiment(gym: Gym, args: argparse.Namespace) -> None:
    x = gym.records.experiments.get(args.id)
    if args.json:
        _print_json(_dump(x))
        return
    _table([["ID", "NAME", "STATUS", "PARENTS", "CHECKPOINTS", "SCORES"], _experiment_row(x)])
    for e in x.events or []:
        _out(f"  #{e.seq} {e.kind} {json.dumps(e.data, ensure_ascii=False, sort_keys=True)}")


def _records_new(gym: Gym, args: argparse.Namespace) -> None:
    x = gym.records.experiments.create(args.name, parents=args.parent, note=args.note)
    if args.json:
        _print_json(_dump(x))
        return
    _out(x.id)


def _records_diff(gym: Gym, args: argparse.Namespace) -> None:
    d = gym.records.experiments.diff(args.a, args.b)
    if args.json:
        _print_json(_dump(d))
        return
    _out(f"config: {'same' if d.config.get('same') else 'differs'}")
    for f in d.config.get("fields") or []:
        _out(f"  {f['field']}: {json.dumps(f['a'])} -> {json.dumps(f['b'])}")
    for name in ("added", "removed"):
        for ds in d.data.get(name) or []:
            _out(f"data {name}: {ds.get('id') or '-'} sha256 {str(ds.get('sha256'))[:12]}")
    for sc in d.scores:
        delta = "-" if sc.get("delta") is None else f"{sc['delta']:+.3f}"
        _out(f"score {sc['benchmark']}/{sc['split']}: {sc.get('a')} -> {sc.get('b')} ({delta})")


def _records_lineage(gym: Gym, args: argparse.Namespace) -> None:
    lineage = gym.records.lineage(args.checkpoint)
    if args.json:
        _print_json(_dump(lineage))
        return
    for link in lineage.links:
        datasets = ",".join(str(d.get("sha256"))[:12] for d in link.get("datasets") or []) or "-"
        _out(f"{link['checkpoint']}  job {link.get('job_id')}  config {str(link.get('config_hash'))[:12]}  "
             f"data {datasets}  experiment {link.get('experiment_id')}")
    _out(f"base model {lineage.base_model}")


def _records_best(gym: Gym, args: argparse.Namespace) -> None:
    best = gym.records.best_checkpoint(benchmark=args.benchmark, split=args.split)
    if args.json:
        _print_json(_dump(best))
        return
    _out(best.checkpoint)
    _err(f"score {best.score:.4f} on {best.benchmark or 'all benchmarks'}/{best.split} "
         f"(experiment {best.experiment_id})")


def _records_annotate(gym: Gym, args: argparse.Namespace) -> int:
    body = args.json_file
    if body.get("kind", args.kind) != args.kind:
        _err(f"error: {args.json_file_name} says kind {body['kind']!r}, not {args.kind!r}")
        return 2
    note = gym.records.annotations.create({**body, "kind": args.kind})
    if args.print_json:
        _print_json(_dump(note))
    else:
        _out(note.id)
    return 0


def _records_annotations(gym: Gym, args: argparse.Namespace) -> None:
    notes = gym.records.annotations.list(kind=args.kind, experiment=args.experiment)
    if args.json:
        _print_json([_dump(n) for n in notes])
        return
    if not notes:
        _out("no annotations")
        return
    for n in notes:
        text = getattr(n, "statement", None) or getattr(n, "claim", None) or getattr(n, "note", None) or ""
        _out(f"{n.id}  {n.kind}  by {n.key_id}  on {','.join(n.experiment_ids) or '-'}  {text}")


def _records_chain(gym: Gym, args: argparse.Namespace) -> int:
    chain = gym.records.chain()
    if args.json:
        _print_json(_dump(chain))
    else:
        word = "ok" if chain.ok else ("UNVERIFIABLE" if chain.status == "unverifiable" else "BROKEN")
        _out(f"{word}: {chain.events} events, head at {chain.head_seq}")
        for p in chain.problems:
            _out(f"  #{p.get('seq')} {p.get('problem')}: {p.get('detail')}")
    return 0 if chain.ok else 1


def _add_records(services: Any) -> None:
    records = services.add_parser("records", help="the run's record: events, experiments, lineage, annotations")
    verbs = records.add_subparsers(dest="verb", metavar="<verb>", required=True)
    events = verbs.add_parser("events", help="platform events (one page, by sequence number)")
    events.add_argument("--kind", metavar="K", help="e.g. training.job, evaluation.job, call.refused")
    events.add_argument("--experiment", metavar="ID")
    events.add_argument("--after", type=int, metavar="SEQ", help="events after this sequence number")
    events.add_argument("--limit", type=_positive_int, metavar="N")
    _add_json(events)
    events.set_defaults(handler=_records_events)
    listing = verbs.add_parser("experiments", help="the experiments this key may read")
    _add_json(listing)
    listing.set_defaults(handler=_records_experiments)
    one = verbs.add_parser("experiment", help="one experiment with its events")
    one.add_argument("id", metavar="ID")
    _add_json(one)
    one.set_defaults(handler=_records_experiment)
    new = verbs.add_parser("new", help="create an experiment and print its id (name it on training/eval calls)")
    new.add_argument("name", metavar="NAME")
    new.add_argument("--parent", action="append", metavar="ID", help="an experiment it continues (repeatable)")
    new.add_argument("--note", metavar="TEXT")
    _add_json(new)
    new.set_defaults(handler=_records_new)
    diff = verbs.add_parser("diff", help="config, data and scores of B against A")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    _add_json(diff)
    diff.set_defaults(handler=_records_diff)
    lineage = verbs.add_parser("lineage", help="a checkpoint's chain back to its base model")
    lineage.add_argument("checkpoint", metavar="CKPT")
    _add_json(lineage)
    lineage.set_defaults(handler=_records_lineage)
    best = verbs.add_parser("best", help="the best checkpoint among accepted experiments")
    best.add_argument("--benchmark", metavar="B")
    best.add_argument("--split", default="dev", help="default: dev")
    _add_json(best)
    best.set_defaults(handler=_records_best)
    annotate = verbs.add_parser("annotate", help="write a hypothesis, finding or review and print its id",
                                description="FILE holds the annotation's fields as a JSON object, e.g. a finding: "
                                            '{"claim": "...", "experiment_ids": ["exp_..."], "metric": "dev", '
                                            '"value": 0.6}.')
    annotate.add_argument("kind", choices=("hypothesis", "finding", "review"))
    annotate.add_argument("--json", dest="json_file", type=_policy_file, required=True, metavar="FILE")
    annotate.add_argument("--print-json", action="store_true", dest="print_json", help="print the stored annotation")
    annotate.set_defaults(handler=_records_annotate, json_file_name="FILE")
    notes = verbs.add_parser("annotations", help="annotations this key may read")
    notes.add_argument("--kind", metavar="K")
    notes.add_argument("--experiment", metavar="ID")
    _add_json(notes)
    notes.set_defaults(handler=_records_annotations)
    chain = verbs.add_parser("chain", help="verify the run's event chain (exit 1 when broken)")
    _add_json(chain)
    chain.set_defaults(handler=_records_chain)


# ---- parser -------------------------------------------------------------------------


def _policy_file(path: str) -> dict[str, Any]:
    """argparse ``type=``: a JSON object read from a file (a bad file is a usage error)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{path} must hold a JSON object")
    return data


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gym",
        description="RSIGym agent CLI. Reads RSIGYM_URL and RSIGYM_API_KEY from the environment.",
    )
    parser.add_argument("--version", action="version", version=f"gym (rsigym-sdk) {__version__}")
    services = parser.add_subparsers(dest="service", metavar="<service>", required=True)

    balance = services.add_parser("balance", help="show the run's budget")
    _add_json(balance)
    balance.set_defaults(handler=_balance)

    rollout = services.add_parser("rollout", help="frontier / teacher models (OpenAI-compatible)")
    rollout_verbs = rollout.add_subparsers(dest="verb", metavar="<verb>", required=True)
    models = rollout_verbs.add_parser("models", help="list the models and their prices")
    _add_json(models)
    models.set_defaults(handler=_rollout_models)
    chat = rollout_verbs.add_parser("chat", help="one chat completion")
    chat.add_argument("--model", required=True)
    chat.add_argument("--system", help="system message")
    chat.add_argument("--max-tokens", type=int, dest="max_tokens")
    chat.add_argument("--temperature", type=float)
    chat.add_argument("--stream", action="store_true", help="print the reply as it is generated")
    _add_json(chat)
    chat.add_argument("prompt", metavar="PROMPT", help="the user message ('-' reads stdin)")
    chat.set_defaults(handler=_rollout_chat)

    keys = services.add_parser("keys", help="child keys minted from this run's key")
    key_verbs = keys.add_subparsers(dest="verb", metavar="<verb>", required=True)
    mint = key_verbs.add_parser("mint", help="mint a child key (its secret is shown once)")
    mint.add_argument("--name")
    mint.add_argument("--budget", type=float, metavar="USD", help="cap on what the key may spend")
    mint.add_argument("--policy-file", type=_policy_file, metavar="F.json", help="JSON policy narrowing the key")
    _add_json(mint)
    mint.set_defaults(handler=_keys_mint)
    listing = key_verbs.add_parser("list", help="list child keys")
    _add_json(listing)
    listing.set_defaults(handler=_keys_list)
    revoke = key_verbs.add_parser("revoke", help="revoke a child key")
    revoke.add_argument("id", metavar="ID")
    _add_json(revoke)
    revoke.set_defaults(handler=_keys_revoke)

    sandbox = services.add_parser("sandbox", help="sandboxes (E2B-compatible): run commands, move files")
    sandbox_verbs = sandbox.add_subparsers(dest="verb", metavar="<verb>", required=True)
    create = sandbox_verbs.add_parser("create", help="start a sandbox and print its id")
    create.add_argument("--template", help="template name (default: the gym's default)")
    create.add_argument("--timeout", type=int, metavar="S", help="seconds until it is killed (default 300)")
    _add_json(create)
    create.set_defaults(handler=_sandbox_create)
    run = sandbox_verbs.add_parser(
        "run", help="run a command in a sandbox; exits with its exit code",
        description="Runs CMD with bash -l -c in the sandbox, printing its output as it comes. One CMD word "
                    "is a shell command line (quote it: -- 'ls | wc -l'); several are passed as separate words.",
    )
    run.add_argument("id", metavar="ID")
    run.add_argument("--cwd", help="working directory (default /home/user)")
    run.add_argument("--env", type=_env_pair, action="append", metavar="NAME=VALUE", help="environment variable")
    run.add_argument("--timeout", type=float, metavar="S", help="kill the command after S seconds (exit 124)")
    run.add_argument("command", nargs="+", metavar="CMD", help="the command, after --")
    run.set_defaults(handler=_sandbox_run)
    ls = sandbox_verbs.add_parser("ls", help="list running sandboxes (--all: ended ones too)")
    ls.add_argument("--all", action="store_true", help="include ended sandboxes")
    _add_json(ls)
    ls.set_defaults(handler=_sandbox_ls)
    info = sandbox_verbs.add_parser("info", help="a sandbox's state, seconds and cost")
    info.add_argument("id", metavar="ID")
    _add_json(info)
    info.set_defaults(handler=_sandbox_info)
    kill = sandbox_verbs.add_parser("kill", help="kill a sandbox")
    kill.add_argument("id", metavar="ID")
    kill.set_defaults(handler=_sandbox_kill)
    _add_evaluation(services)
    _add_records(services)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _add_evaluation(services: Any) -> None:
    evaluation = services.add_parser("eval", help="evaluation: benchmarks and evaluation jobs")
    verbs = evaluation.add_subparsers(dest="verb", metavar="<verb>", required=True)
    benchmarks = verbs.add_parser("benchmarks", help="list the benchmarks and their splits")
    _add_json(benchmarks)
    benchmarks.set_defaults(handler=_eval_benchmarks)
    run = verbs.add_parser("run", help="start an evaluation job and print its id",
                           description="Evaluates MODEL with a harness on a benchmark split. Trials run in "
                                       "sandboxes and call the model through the gym: both are charged to the run.")
    run.add_argument("--benchmark", required=True, metavar="B")
    run.add_argument("--model", required=True, metavar="M", help="a base model or one of this run's checkpoints")
    run.add_argument("--split", default="dev", help="default: dev")
    run.add_argument("--harness", default=MINIMAL_HARNESS, metavar="minimal|ID",
                     help="'minimal' (default) or an uploaded harness id")
    run.add_argument("--attempts", type=_positive_int, default=1, metavar="N", help="attempts per task (avg@N)")
    run.add_argument("--limit", type=_positive_int, metavar="N", help="only the split's first N tasks")
    run.add_argument("--task", action="append", metavar="ID", help="only this task (repeatable)")
    run.add_argument("--experiment", metavar="EXP", help="attach to this experiment of yours (default: the one "
                                                          "that produced the checkpoint, or a new implicit one)")
    run.add_argument("--temperature", type=float)
    run.add_argument("--top-p", type=float, dest="top_p")
    run.add_argument("--max-tokens", type=int, dest="max_tokens")
    run.add_argument("--seed", type=int)
    run.add_argument("--wait", action="store_true", help="show progress until the job ends, then its score")
    run.add_argument("--poll", type=float, default=2.0, metavar="S", help="seconds between polls with --wait")
    _add_json(run)
    run.set_defaults(handler=_eval_run)
    ls = verbs.add_parser("ls", help="this run's evaluation jobs")
    _add_json(ls)
    ls.set_defaults(handler=_eval_ls)
    status = verbs.add_parser("status", help="a job's status, progress and score")
    status.add_argument("id", metavar="ID")
    _add_json(status)
    status.set_defaults(handler=_eval_status)
    results = verbs.add_parser("results", help="a job's per-trial results (rewards; --json: trajectories too)")
    results.add_argument("id", metavar="ID")
    _add_json(results)
    results.set_defaults(handler=_eval_results)
    cancel = verbs.add_parser("cancel", help="cancel a job (finished trials keep their results)")
    cancel.add_argument("id", metavar="ID")
    _add_json(cancel)
    cancel.set_defaults(handler=_eval_cancel)

    harness = services.add_parser("harness", help="harness archives for evaluation")
    harness_verbs = harness.add_subparsers(dest="verb", metavar="<verb>", required=True)
    upload = harness_verbs.add_parser("upload", help="upload a harness and print its id",
                                      description="PATH is a .tar.gz with harness.toml at its root, or a directory "
                                                  "holding harness.toml (archived deterministically first).")
    upload.add_argument("path", metavar="PATH")
    _add_json(upload)
    upload.set_defaults(handler=_harness_upload)
    harness_ls = harness_verbs.add_parser("ls", help="this run's uploaded harnesses")
    _add_json(harness_ls)
    harness_ls.set_defaults(handler=_harness_ls)

    submit = services.add_parser("submit", help="submit the run's result for scoring (what the track asks for)",
                                 description="data track: --checkpoint; harness track: --harness (and optionally "
                                             "--base-model); joint track: both. You may submit again: the latest "
                                             "submission before the run ends is scored (scoring ends the run).")
    submit.add_argument("--checkpoint", metavar="C", help="a checkpoint id of this run")
    submit.add_argument("--harness", metavar="H", help="an uploaded harness id (or 'minimal')")
    submit.add_argument("--base-model", dest="base_model", metavar="M", help="the base model, when no checkpoint")
    _add_json(submit)
    submit.set_defaults(handler=_submit)


def main(argv: Sequence[str] | None = None, *, client_factory: ClientFactory = Gym) -> int:
    """Run the CLI; returns the exit code. ``client_factory`` builds the :class:`Gym`
    (tests pass one with a mock transport)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help / --version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        with client_factory() as gym:
            code = args.handler(gym, args)  # most handlers return None (success); some their exit code
    except RSIGymError as err:
        _err(format_error(err))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gym ... | head`
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
