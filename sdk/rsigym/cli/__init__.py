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
    gym mcp                               the same operations as MCP tools on stdio (rsigym.mcp)

Exit codes: 0 success, 1 an error from the gym or the network (printed to stderr as
``error: <type>: <message> (request_id …)``), 2 a usage error; ``sandbox run`` exits with
the command's own exit code (124 when its ``--timeout`` ran out); ``eval run --wait`` exits 1
when the job ends other than ``succeeded``. ``--json`` prints
machine-readable JSON on stdout. In plain mode ``chat`` prints the reply on stdout and
its cost / remaining budget on stderr, so the reply can be piped on its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from .._client import Gym
from .._version import __version__
from ..errors import RSIGymError
from . import balance, evaluation, keys, mcp, records, rollout, sandbox
from .output import echo_err, format_error, format_usd

__all__ = ["main", "build_parser", "format_error", "format_usd"]

ClientFactory = Callable[[], Gym]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gym",
        description="RSIGym agent CLI. Reads RSIGYM_URL and RSIGYM_API_KEY from the environment.",
    )
    parser.add_argument("--version", action="version", version=f"gym (rsigym-sdk) {__version__}")
    services = parser.add_subparsers(dest="service", metavar="<service>", required=True)
    for group in (balance, rollout, keys, sandbox, evaluation, records, mcp):  # the order `gym --help` lists them
        group.add_commands(services)
    return parser


def main(argv: Sequence[str] | None = None, *, client_factory: ClientFactory = Gym) -> int:
    """Run the CLI; returns the exit code. ``client_factory`` builds the :class:`Gym`
    (tests pass one with a mock transport)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help / --version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args, "standalone", None) is not None:  # `gym mcp`: builds its own client from the environment
        code = args.standalone(args)
        return code if isinstance(code, int) else 0
    try:
        with client_factory() as gym:
            code = args.handler(gym, args)  # most handlers return None (success); some their exit code
    except RSIGymError as err:
        echo_err(format_error(err))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gym ... | head`
        return 1
    return code if isinstance(code, int) else 0
