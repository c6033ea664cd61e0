"""``gym sandbox …``: sandboxes (E2B-compatible): create, run a command, list, inspect, kill."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from typing import Any

from .._client import Gym
from ..errors import APITimeoutError
from ..types import SandboxRecord
from .arguments import add_json
from .output import echo, echo_err, format_error, format_usd, print_json, print_table


def _sandbox_create(gym: Gym, args: argparse.Namespace) -> None:
    sbx = gym.sandbox.create(args.template, timeout=args.timeout)
    if args.json:
        print_json({"id": sbx.id, "template": sbx.template})
        return
    echo(sbx.id)
    echo_err(f"sandbox {sbx.id} ({sbx.template}) is running; `gym sandbox kill {sbx.id}` ends it")


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
        echo_err(format_error(err))
        return 124
    code = result.exit_code
    if code < 0 and not (result.status or "").startswith("signal"):  # e.g. the sandbox itself ended
        echo_err(f"error: {result.status or 'the command ended abnormally'} (see `gym sandbox info {args.id}`)")
        return 1
    return 128 - code if code < 0 else code & 0xFF  # killed by signal N (code -N): 128 + N, as shells do


def _record_dict(record: SandboxRecord) -> dict[str, Any]:
    return record.model_dump(mode="json")


def _sandbox_ls(gym: Gym, args: argparse.Namespace) -> None:
    records = gym.sandbox.list(state=None if args.all else "running")
    if args.json:
        print_json([_record_dict(r) for r in records])
        return
    if not records:
        echo("no sandboxes" if args.all else "no running sandboxes")
        return
    rows = [["ID", "TEMPLATE", "STATE", "SECONDS", "COST", "STARTED"]]
    for r in records:
        started = r.started_at.strftime("%Y-%m-%d %H:%M:%S") if r.started_at else "-"
        rows.append([r.id, r.template, r.state, f"{r.seconds:.1f}", format_usd(r.cost_usd), started])
    print_table(rows)


def _sandbox_info(gym: Gym, args: argparse.Namespace) -> None:
    record = gym.sandbox.get(args.id)
    if args.json:
        print_json(_record_dict(record))
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
    print_table(rows)


def _sandbox_kill(gym: Gym, args: argparse.Namespace) -> None:
    if gym.sandbox.kill(args.id):
        echo(f"{args.id}: killed")
    else:
        echo(f"{args.id}: not running")


def add_commands(services: Any) -> None:
    sandbox = services.add_parser("sandbox", help="sandboxes (E2B-compatible): run commands, move files")
    sandbox_verbs = sandbox.add_subparsers(dest="verb", metavar="<verb>", required=True)
    create = sandbox_verbs.add_parser("create", help="start a sandbox and print its id")
    create.add_argument("--template", help="template name (default: the gym's default)")
    create.add_argument("--timeout", type=int, metavar="S", help="seconds until it is killed (default 300)")
    add_json(create)
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
    add_json(ls)
    ls.set_defaults(handler=_sandbox_ls)
    info = sandbox_verbs.add_parser("info", help="a sandbox's state, seconds and cost")
    info.add_argument("id", metavar="ID")
    add_json(info)
    info.set_defaults(handler=_sandbox_info)
    kill = sandbox_verbs.add_parser("kill", help="kill a sandbox")
    kill.add_argument("id", metavar="ID")
    kill.set_defaults(handler=_sandbox_kill)
