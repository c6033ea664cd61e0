"""``gym records …``: the run's record: events, experiments, lineage, annotations, its hash chain."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._client import Gym
from ..types import Experiment
from .arguments import add_json, json_object_file, positive_int
from .output import dump, echo, echo_err, print_json, print_table


def _records_events(gym: Gym, args: argparse.Namespace) -> None:
    events = gym.records.events(kind=args.kind, experiment=args.experiment, after=args.after, limit=args.limit)
    if args.json:
        print_json([dump(e) for e in events])
        return
    if not events:
        echo("no events")
        return
    rows = [["SEQ", "KIND", "EXPERIMENT", "KEY", "CREATED"]]
    for e in events:
        created = e.created_at.strftime("%Y-%m-%d %H:%M:%S") if e.created_at else "-"
        rows.append([str(e.seq), e.kind, e.experiment_id or "-", e.key_id or "-", created])
    print_table(rows)


def _experiment_row(x: Experiment) -> list[str]:
    scores = " ".join(f"{v.benchmark}/{v.split}={v.score:.3f}" for v in x.evaluations if v.score is not None)
    return [x.id, x.name, x.status, ",".join(x.parents) or "-", ",".join(x.theta_out.get("checkpoints") or []) or "-",
            scores or "-"]


def _records_experiments(gym: Gym, args: argparse.Namespace) -> None:
    experiments = gym.records.experiments.list()
    if args.json:
        print_json([dump(x) for x in experiments])
        return
    if not experiments:
        echo("no experiments")
        return
    print_table([["ID", "NAME", "STATUS", "PARENTS", "CHECKPOINTS", "SCORES"], *map(_experiment_row, experiments)])


def _records_experiment(gym: Gym, args: argparse.Namespace) -> None:
    x = gym.records.experiments.get(args.id)
    if args.json:
        print_json(dump(x))
        return
    print_table([["ID", "NAME", "STATUS", "PARENTS", "CHECKPOINTS", "SCORES"], _experiment_row(x)])
    for e in x.events or []:
        echo(f"  #{e.seq} {e.kind} {json.dumps(e.data, ensure_ascii=False, sort_keys=True)}")


def _records_new(gym: Gym, args: argparse.Namespace) -> None:
    x = gym.records.experiments.create(args.name, parents=args.parent, note=args.note)
    if args.json:
        print_json(dump(x))
        return
    echo(x.id)


def _records_diff(gym: Gym, args: argparse.Namespace) -> None:
    d = gym.records.experiments.diff(args.a, args.b)
    if args.json:
        print_json(dump(d))
        return
    echo(f"config: {'same' if d.config.get('same') else 'differs'}")
    for f in d.config.get("fields") or []:
        echo(f"  {f['field']}: {json.dumps(f['a'])} -> {json.dumps(f['b'])}")
    for name in ("added", "removed"):
        for ds in d.data.get(name) or []:
            echo(f"data {name}: {ds.get('id') or '-'} sha256 {str(ds.get('sha256'))[:12]}")
    for sc in d.scores:
        delta = "-" if sc.get("delta") is None else f"{sc['delta']:+.3f}"
        echo(f"score {sc['benchmark']}/{sc['split']}: {sc.get('a')} -> {sc.get('b')} ({delta})")


def _records_lineage(gym: Gym, args: argparse.Namespace) -> None:
    lineage = gym.records.lineage(args.checkpoint)
    if args.json:
        print_json(dump(lineage))
        return
    for link in lineage.links:
        datasets = ",".join(str(d.get("sha256"))[:12] for d in link.get("datasets") or []) or "-"
        echo(f"{link['checkpoint']}  job {link.get('job_id')}  config {str(link.get('config_hash'))[:12]}  "
             f"data {datasets}  experiment {link.get('experiment_id')}")
    echo(f"base model {lineage.base_model}")


def _records_best(gym: Gym, args: argparse.Namespace) -> None:
    best = gym.records.best_checkpoint(benchmark=args.benchmark, split=args.split)
    if args.json:
        print_json(dump(best))
        return
    echo(best.checkpoint)
    echo_err(f"score {best.score:.4f} on {best.benchmark or 'all benchmarks'}/{best.split} "
         f"(experiment {best.experiment_id}, {best.audit})")


def _records_annotate(gym: Gym, args: argparse.Namespace) -> int:
    body = args.json_file
    if body.get("kind", args.kind) != args.kind:
        echo_err(f"error: {args.json_file_name} says kind {body['kind']!r}, not {args.kind!r}")
        return 2
    note = gym.records.annotations.create({**body, "kind": args.kind})
    if args.print_json:
        print_json(dump(note))
    else:
        echo(note.id)
    return 0


def _records_annotations(gym: Gym, args: argparse.Namespace) -> None:
    notes = gym.records.annotations.list(kind=args.kind, experiment=args.experiment)
    if args.json:
        print_json([dump(n) for n in notes])
        return
    if not notes:
        echo("no annotations")
        return
    for n in notes:
        text = getattr(n, "statement", None) or getattr(n, "claim", None) or getattr(n, "note", None) or ""
        echo(f"{n.id}  {n.kind}  by {n.key_id}  on {','.join(n.experiment_ids) or '-'}  {text}")


def _records_chain(gym: Gym, args: argparse.Namespace) -> int:
    chain = gym.records.chain()
    if args.json:
        print_json(dump(chain))
    else:
        word = "ok" if chain.ok else ("UNVERIFIABLE" if chain.status == "unverifiable" else "BROKEN")
        echo(f"{word}: {chain.events} events, head at {chain.head_seq}")
        for p in chain.problems:
            echo(f"  #{p.get('seq')} {p.get('problem')}: {p.get('detail')}")
    return 0 if chain.ok else 1


def add_commands(services: Any) -> None:
    records = services.add_parser("records", help="the run's record: events, experiments, lineage, annotations")
    verbs = records.add_subparsers(dest="verb", metavar="<verb>", required=True)
    events = verbs.add_parser("events", help="platform events (one page, by sequence number)")
    events.add_argument("--kind", metavar="K", help="e.g. training.job, evaluation.job, call.refused")
    events.add_argument("--experiment", metavar="ID")
    events.add_argument("--after", type=int, metavar="SEQ", help="events after this sequence number")
    events.add_argument("--limit", type=positive_int, metavar="N")
    add_json(events)
    events.set_defaults(handler=_records_events)
    listing = verbs.add_parser("experiments", help="the experiments this key may read")
    add_json(listing)
    listing.set_defaults(handler=_records_experiments)
    one = verbs.add_parser("experiment", help="one experiment with its events")
    one.add_argument("id", metavar="ID")
    add_json(one)
    one.set_defaults(handler=_records_experiment)
    new = verbs.add_parser("new", help="create an experiment and print its id (name it on training/eval calls)")
    new.add_argument("name", metavar="NAME")
    new.add_argument("--parent", action="append", metavar="ID", help="an experiment it continues (repeatable)")
    new.add_argument("--note", metavar="TEXT")
    add_json(new)
    new.set_defaults(handler=_records_new)
    diff = verbs.add_parser("diff", help="config, data and scores of B against A")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    add_json(diff)
    diff.set_defaults(handler=_records_diff)
    lineage = verbs.add_parser("lineage", help="a checkpoint's chain back to its base model")
    lineage.add_argument("checkpoint", metavar="CKPT")
    add_json(lineage)
    lineage.set_defaults(handler=_records_lineage)
    best = verbs.add_parser("best", help="the best checkpoint among accepted experiments")
    best.add_argument("--benchmark", metavar="B")
    best.add_argument("--split", default="dev", help="default: dev")
    add_json(best)
    best.set_defaults(handler=_records_best)
    annotate = verbs.add_parser("annotate", help="write a hypothesis, finding or review and print its id",
                                description="FILE holds the annotation's fields as a JSON object, e.g. a finding: "
                                            '{"claim": "...", "experiment_ids": ["exp_..."], "metric": "dev", '
                                            '"value": 0.6}.')
    annotate.add_argument("kind", choices=("hypothesis", "finding", "review"))
    annotate.add_argument("--json", dest="json_file", type=json_object_file, required=True, metavar="FILE")
    annotate.add_argument("--print-json", action="store_true", dest="print_json", help="print the stored annotation")
    annotate.set_defaults(handler=_records_annotate, json_file_name="FILE")
    notes = verbs.add_parser("annotations", help="annotations this key may read")
    notes.add_argument("--kind", metavar="K")
    notes.add_argument("--experiment", metavar="ID")
    add_json(notes)
    notes.set_defaults(handler=_records_annotations)
    chain = verbs.add_parser("chain", help="verify the run's event chain (exit 1 when broken)")
    add_json(chain)
    chain.set_defaults(handler=_records_chain)
