"""``gym.training``: datasets, LoRA training jobs and checkpoints.

Jobs meter themselves step by step against the run's budget; when the next step cannot be
paid for, the job ends with status ``budget_exhausted`` and keeps its last checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._base_client import APICall
from .._response import ObjectList, parse_list, parse_object
from ..types import Checkpoint, Dataset, TrainingJob
from ._resource import AsyncResource, SyncResource, drop_none, path_id


def _jsonl(rows: Iterable[Mapping[str, Any]] | str | Path | bytes) -> bytes:
    if isinstance(rows, bytes):
        return rows
    if isinstance(rows, str | Path):
        return Path(rows).read_bytes()
    return "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows).encode()


def upload_call(rows: Any, name: str | None) -> APICall[Dataset]:
    return APICall("POST", "/training/v1/datasets", parse_object(Dataset), content=_jsonl(rows),
                   content_type="application/jsonl", params=drop_none({"name": name}) or None)


def create_job_call(params: dict[str, Any]) -> APICall[TrainingJob]:
    return APICall("POST", "/training/v1/jobs", parse_object(TrainingJob), json=drop_none(params))


def get_job_call(job_id: str) -> APICall[TrainingJob]:
    return APICall("GET", f"/training/v1/jobs/{path_id(job_id)}", parse_object(TrainingJob))


def cancel_call(job_id: str) -> APICall[TrainingJob]:
    return APICall("POST", f"/training/v1/jobs/{path_id(job_id)}/cancel", parse_object(TrainingJob))


def logs_call(job_id: str) -> APICall[str]:
    return APICall("GET", f"/training/v1/jobs/{path_id(job_id)}/logs", lambda r: r.text)


def checkpoints_call() -> APICall[ObjectList[Checkpoint]]:
    return APICall("GET", "/training/v1/checkpoints", parse_list(Checkpoint))


def datasets_call() -> APICall[ObjectList[Dataset]]:
    return APICall("GET", "/training/v1/datasets", parse_list(Dataset))


class Training(SyncResource):
    def upload_dataset(self, rows: Iterable[Mapping[str, Any]] | str | Path | bytes, *, name: str | None = None) -> Dataset:
        """Upload JSONL: an iterable of row dicts, a file path or raw bytes."""
        return self._client._request(upload_call(rows, name))

    def datasets(self) -> ObjectList[Dataset]:
        return self._client._request(datasets_call())

    def create_job(self, **params: Any) -> TrainingJob:
        """Submit a job: ``datasets=[ids]``, ``base_model`` or ``parent_checkpoint``, ``lora={...}``,
        ``learning_rate``, ``steps`` or ``epochs``, ``batch_size``, … (see the agent guide).
        ``experiment="exp_…"`` attaches it to one of this key's experiments (default: a new one
        continuing the parent checkpoint's experiment)."""
        return self._client._request(create_job_call(params))

    def get_job(self, job_id: str) -> TrainingJob:
        return self._client._request(get_job_call(job_id))

    def cancel_job(self, job_id: str) -> TrainingJob:
        return self._client._request(cancel_call(job_id))

    def logs(self, job_id: str) -> str:
        return self._client._request(logs_call(job_id))

    def checkpoints(self) -> ObjectList[Checkpoint]:
        return self._client._request(checkpoints_call())

    def wait(self, job_id: str, *, timeout: float = 3600, poll: float = 1.0) -> TrainingJob:
        """Poll until the job reaches a final status."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.done or time.monotonic() > deadline:
                return job
            time.sleep(poll)


class AsyncTraining(AsyncResource):
    async def upload_dataset(self, rows: Any, *, name: str | None = None) -> Dataset:
        return await self._client._request(upload_call(rows, name))

    async def datasets(self) -> ObjectList[Dataset]:
        return await self._client._request(datasets_call())

    async def create_job(self, **params: Any) -> TrainingJob:
        return await self._client._request(create_job_call(params))

    async def get_job(self, job_id: str) -> TrainingJob:
        return await self._client._request(get_job_call(job_id))

    async def cancel_job(self, job_id: str) -> TrainingJob:
        return await self._client._request(cancel_call(job_id))

    async def logs(self, job_id: str) -> str:
        return await self._client._request(logs_call(job_id))

    async def checkpoints(self) -> ObjectList[Checkpoint]:
        return await self._client._request(checkpoints_call())
