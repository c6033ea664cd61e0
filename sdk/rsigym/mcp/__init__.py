"""``gym mcp``: the gym's operations as MCP tools for a run's agent (Claude Code, Codex, any MCP
client), served on stdio and grouped as RSI-Master's Experiment OS:

* ``data_*`` — datasets (upload, list, inspect), benchmarks, training pools (:mod:`.data`);
* ``execution_*`` — training, inference/rollout chat, evaluation, harnesses, sandboxes, submission
  (:mod:`.execution`);
* ``evidence_*`` — experiments, diffs, lineage, hypotheses, findings, events, the best checkpoint,
  the balance (:mod:`.evidence`);
* ``review_*`` — reviews and decisions (:mod:`.review`).

Every tool calls the gym through the SDK with the run's key, so permissions, metering and refusals
are exactly the HTTP API's. It needs only the SDK, ``mcp`` and the standard library (the extra
``rsigym-sdk[mcp]``).
"""

from .server import GROUPS, build_server, main

__all__ = ["GROUPS", "build_server", "main"]
