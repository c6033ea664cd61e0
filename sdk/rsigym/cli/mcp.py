"""``gym mcp``: serve the Experiment OS as MCP tools on stdio (see :mod:`rsigym.mcp`).

It builds its own client from the environment, so it runs before ``main`` would build one; the
``mcp`` package is imported only here, so the other commands do not need it.
"""

from __future__ import annotations

import argparse
from typing import Any


def _serve(args: argparse.Namespace) -> int:
    from ..mcp.server import main

    return main()


def add_commands(services: Any) -> None:
    mcp = services.add_parser(
        "mcp", help="serve the gym's operations as MCP tools on stdio (for Claude Code, Codex, any MCP client)")
    mcp.set_defaults(standalone=_serve)
