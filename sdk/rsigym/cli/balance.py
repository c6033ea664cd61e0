"""``gym balance``: the run's budget."""

from __future__ import annotations

import argparse
from typing import Any

from .._client import Gym
from .arguments import add_json
from .output import echo, format_usd, print_json


def _balance(gym: Gym, args: argparse.Namespace) -> None:
    balance = gym.balance()
    if args.json:
        print_json(balance.model_dump(mode="json"))
        return
    echo(
        f"remaining {format_usd(balance.remaining_usd)} of {format_usd(balance.budget_usd)} "
        f"(spent {format_usd(balance.spent_usd)}, reserved {format_usd(balance.reserved_usd)})"
    )


def add_commands(services: Any) -> None:
    balance = services.add_parser("balance", help="show the run's budget")
    add_json(balance)
    balance.set_defaults(handler=_balance)
