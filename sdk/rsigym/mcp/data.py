"""``data_*``: training datasets, benchmark training pools and the benchmarks the key may see.

Nothing here is metered; an upload counts against the run's storage quota.
"""

from __future__ import annotations

import json
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

from .._base_client import APICall
from .._client import Gym
from ..resources._resource import path_id
from ._tools import Result, ToolRegistrar, dump

__all__ = ["register"]


def _dataset_content_call(dataset_id: str) -> APICall[str]:
    """``GET /training/v1/datasets/{id}/content`` (the gateway serves it; the SDK has no method yet)."""
    return APICall("GET", f"/training/v1/datasets/{path_id(dataset_id)}/content", lambda r: r.text)


def register(server: MCPServer, gym: Gym) -> None:
    tool = ToolRegistrar(server, "data")

    @tool("upload_dataset", "Upload a JSONL file from this machine as a training dataset (free; counts against "
          "the run's storage quota; identical content is stored once).")
    def upload_dataset(
        path: Annotated[str, Field(description="path of a .jsonl file on this machine")],
        name: Annotated[str | None, Field(description="a name to show in listings")] = None,
    ) -> Result:
        return dump(gym.training.upload_dataset(path, name=name))

    @tool("list_datasets", "List the run's uploaded datasets: id, name, rows, bytes, sha256 (free).", read_only=True)
    def list_datasets() -> Result:
        return dump(gym.training.datasets())

    @tool("inspect_dataset", "Show the first rows of one of the run's datasets and its row count (free).",
          read_only=True)
    def inspect_dataset(
        dataset_id: Annotated[str, Field(description="a dataset id (ds_…)")],
        rows: Annotated[int, Field(ge=1, le=200, description="how many rows to show")] = 5,
    ) -> Result:
        lines = [line for line in gym._request(_dataset_content_call(dataset_id)).splitlines() if line.strip()]
        return {"id": dataset_id, "rows": len(lines), "head": [json.loads(line) for line in lines[:rows]]}

    @tool("list_benchmarks", "List the benchmarks the key may evaluate on, with their visible splits and task "
          "counts (hidden splits left out; free).", read_only=True)
    def list_benchmarks() -> Result:
        return dump(gym.evaluation.benchmarks())

    @tool("training_pool", "Read a benchmark's training pool: questions of its form that no task of any split "
          "asks, safe to train on (free).", read_only=True)
    def training_pool(
        benchmark: Annotated[str, Field(description="a benchmark name")],
        offset: Annotated[int, Field(ge=0, description="skip this many questions")] = 0,
        limit: Annotated[int, Field(ge=1, le=1000, description="return at most this many")] = 100,
    ) -> Result:
        questions = gym.evaluation.training_pool(benchmark)
        return {"benchmark": benchmark, "rows": len(questions), "offset": offset,
                "questions": questions[offset:offset + limit]}
