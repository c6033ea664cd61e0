"""``gym``: the agent's command line, a thin layer over :class:`~rsigym.Gym`.

::

    gym balance [--json]
    gym rollout models [--json]
    gym rollout chat --model M [--system S] [--max-tokens N] [--temperature T] [--stream] [--json] PROMPT
    gym keys mint [--name N] [--budget USD] [--policy-file F.json] [--json]
    gym keys list [--json]
    gym keys revoke ID [--json]

Exit codes: 0 success, 1 an error from the gym or the network (printed to stderr as
``error: <type>: <message> (request_id …)``), 2 a usage error. ``--json`` prints
machine-readable JSON on stdout. In plain mode ``chat`` prints the reply on stdout and
its cost / remaining budget on stderr, so the reply can be piped on its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._client import Gym
from ._version import __version__
from .errors import RSIGymError
from .types import ChatCompletionChunk, ChildKey

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
    return parser


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
            args.handler(gym, args)
    except RSIGymError as err:
        _err(format_error(err))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gym ... | head`
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
