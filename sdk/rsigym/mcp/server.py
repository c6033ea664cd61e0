"""The MCP server: the four tool groups over one :class:`~rsigym.Gym`, served on stdio.

The gateway URL and the run key come from ``RSIGYM_URL`` and ``RSIGYM_API_KEY`` only (what the
SDK's client reads), never from an argument or a file: a client configures the server with its
environment, and a key never appears in a process listing.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

from .._client import Gym
from .._config import ENV_API_KEY, ENV_URL
from .._version import __version__
from . import data, evidence, execution, review

__all__ = ["GROUPS", "build_server", "main"]

GROUPS = (data, execution, evidence, review)
"""The Experiment OS's tool groups, in the order they are listed; each prefixes its tools' names."""

INSTRUCTIONS = (
    "RSIGym's Experiment OS for this run. data_*: datasets, benchmarks and training pools. "
    "execution_*: training, inference and rollout chat, evaluation, sandboxes, submission (these spend the "
    "budget). evidence_*: experiments, lineage, diffs, hypotheses and findings, events, the best checkpoint "
    "and the balance. review_*: reviews and decisions. Attach jobs to an experiment (evidence_create_experiment) "
    "so its record is complete. A refused call returns isError with the gym's error type and message."
)


def build_server(gym: Gym) -> MCPServer:
    """The MCP server with every group's tools registered over ``gym``."""
    server: MCPServer = MCPServer("rsigym", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    for group in GROUPS:
        group.register(server, gym)
    return server


def main() -> int:
    """Serve on stdio until the client closes it; 1 at once when the environment lacks the gym."""
    missing = [name for name in (ENV_URL, ENV_API_KEY) if not os.environ.get(name, "").strip()]
    if missing:
        print(f"gym mcp: {' and '.join(missing)} must be set in the environment "
              "(the gym's URL and this run's key)", file=sys.stderr)
        return 1
    with Gym() as gym:
        build_server(gym).run("stdio")
    return 0
