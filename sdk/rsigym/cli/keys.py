"""``gym keys …``: child keys minted from the run's key."""

from __future__ import annotations

import argparse
from typing import Any

from .._client import Gym
from ..types import ChildKey
from .arguments import add_json, json_object_file
from .output import echo, echo_err, format_usd, print_json, print_table


def _key_dict(key: ChildKey) -> dict[str, Any]:
    return key.model_dump(mode="json")


def _keys_mint(gym: Gym, args: argparse.Namespace) -> None:
    key = gym.keys.mint(name=args.name, policy=args.policy_file, budget_usd=args.budget)
    if args.json:
        print_json(_key_dict(key))
        return
    print_table(
        [
            ["id", key.id],
            ["name", key.name or "-"],
            ["budget", format_usd(key.budget_usd) if key.budget_usd is not None else "parent's"],
            ["key", key.key or "-"],
        ]
    )
    if key.key:
        echo_err("the key is shown only once: store it now")


def _keys_list(gym: Gym, args: argparse.Namespace) -> None:
    keys = gym.keys.list()
    if args.json:
        print_json([_key_dict(key) for key in keys])
        return
    if not keys:
        echo("no child keys")
        return
    rows = [["ID", "NAME", "STATUS", "BUDGET", "SPENT"]]
    for key in keys:
        rows.append([key.id, key.name or "-", key.status or "-", format_usd(key.budget_usd), format_usd(key.spent_usd)])
    print_table(rows)


def _keys_revoke(gym: Gym, args: argparse.Namespace) -> None:
    key = gym.keys.revoke(args.id)
    if args.json:
        print_json(_key_dict(key))
        return
    echo(f"{key.id}: {key.status or 'revoked'}")


def add_commands(services: Any) -> None:
    keys = services.add_parser("keys", help="child keys minted from this run's key")
    key_verbs = keys.add_subparsers(dest="verb", metavar="<verb>", required=True)
    mint = key_verbs.add_parser("mint", help="mint a child key (its secret is shown once)")
    mint.add_argument("--name")
    mint.add_argument("--budget", type=float, metavar="USD", help="cap on what the key may spend")
    mint.add_argument("--policy-file", type=json_object_file, metavar="F.json", help="JSON policy narrowing the key")
    add_json(mint)
    mint.set_defaults(handler=_keys_mint)
    listing = key_verbs.add_parser("list", help="list child keys")
    add_json(listing)
    listing.set_defaults(handler=_keys_list)
    revoke = key_verbs.add_parser("revoke", help="revoke a child key")
    revoke.add_argument("id", metavar="ID")
    add_json(revoke)
    revoke.set_defaults(handler=_keys_revoke)
