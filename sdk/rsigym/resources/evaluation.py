"""``gym.evaluation``: benchmarks, harness archives, evaluation jobs; ``gym.submit``.

::

    gym.evaluation.benchmarks()                                  # what you may evaluate on (hidden splits omitted)
    harness = gym.evaluation.upload_harness("my-harness/")       # a directory (archived here) or a .tar.gz
    job = gym.evaluation.run("arithmetic", model="ckpt_…", harness=harness.id, attempts=3, limit=20)
    job = gym.evaluation.wait(job.id, on_progress=lambda j: print(j.progress.done, "/", j.progress.total))
    print(job.status, job.score)                                 # avg@k over the tasks run
    for r in gym.evaluation.results(job.id): print(r.task_id, r.attempt, r.reward)
    gym.submit(checkpoint="ckpt_…", harness=harness.id)          # what the track asks for

A job's trials run in the gym's sandboxes and call the model through the gym, so their sandbox
seconds and tokens are charged to the run's budget like any other use.

A harness archive is a ``.tar.gz`` with ``harness.toml`` at its root; :func:`build_harness_archive`
packs a directory deterministically (the same tree always gives the same bytes, so re-uploading an
unchanged harness returns the harness already stored).
"""

from __future__ import annotations

import asyncio
import gzip
import inspect
import io
import json
import os
import stat
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from .._base_client import APICall
from .._response import ObjectList, parse_list, parse_object
from ..errors import APITimeoutError
from ..types import Benchmark, EvaluationJob, Harness, Submission, TrialResult
from ._resource import AsyncResource, SyncResource, drop_none, path_id

__all__ = ["Evaluation", "AsyncEvaluation", "build_harness_archive", "harness_archive_bytes", "MINIMAL_HARNESS"]

MINIMAL_HARNESS = "minimal"
MANIFEST_NAME = "harness.toml"
ARCHIVE_CONTENT_TYPE = "application/gzip"

ProgressCallback = Callable[[EvaluationJob], Any]
HarnessSource = str | os.PathLike[str] | bytes


# ---- harness archives ---------------------------------------------------------------------


def _check_manifest(root: Path) -> None:
    manifest = root / MANIFEST_NAME
    if not manifest.is_file() or manifest.is_symlink():
        raise ValueError(f"{root} has no {MANIFEST_NAME} at its top level (a regular file)")
    try:
        table = tomllib.loads(manifest.read_text(encoding="utf-8")).get("harness")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{manifest} is not valid TOML: {exc}") from None
    if not isinstance(table, dict):
        raise ValueError(f"{manifest} has no [harness] table")
    for key in ("name", "run"):
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise ValueError(f"{manifest}: [harness] needs a non-empty string {key!r}")


def _members(root: Path) -> list[tuple[str, Path, bool]]:
    """(archive name, path, is_dir) of everything under ``root``, sorted by name, root excluded."""
    found: list[tuple[str, Path, bool]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in dirnames + filenames:
            path = base / name
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                found.append((rel, path, True))
            elif stat.S_ISREG(mode):
                found.append((rel, path, False))
            else:
                what = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
                raise ValueError(f"{rel!r} in {root} is {what}; a harness archive holds regular files and "
                                 "directories only")
    return sorted(found, key=lambda member: member[0])


def harness_archive_bytes(src_dir: str | os.PathLike[str]) -> bytes:
    """The deterministic ``.tar.gz`` of ``src_dir`` (see :func:`build_harness_archive`)."""
    root = Path(src_dir)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    _check_manifest(root)
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, path, is_dir in _members(root):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if is_dir:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            info.mode = 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644
            data = path.read_bytes()
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_harness_archive(src_dir: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """Pack a harness directory as a deterministic ``.tar.gz`` and return ``out_path``.

    ``src_dir`` must hold ``harness.toml`` with a ``[harness]`` table (``name``, ``run``, optional
    ``install``). Members are sorted, have mtime 0, owner 0:0 and modes 0644 / 0755 (executable
    files and directories); only regular files and directories are allowed (a symlink or device
    is a ``ValueError``). Everything under ``src_dir`` is included, so leave out what the harness
    does not need (``.git``, caches). The file is written atomically.
    """
    data = harness_archive_bytes(src_dir)
    out = Path(out_path)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _archive(source: HarnessSource) -> bytes:
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source)
    path = Path(source)
    if path.is_dir():
        return harness_archive_bytes(path)
    return path.read_bytes()


# ---- calls --------------------------------------------------------------------------------


def benchmarks_call() -> APICall[ObjectList[Benchmark]]:
    return APICall("GET", "/evaluation/v1/benchmarks", parse_list(Benchmark))


def _pool_rows(response: httpx.Response) -> list[str]:
    return [json.loads(line)["question"] for line in response.text.splitlines() if line.strip()]


def training_pool_call(benchmark: str) -> APICall[list[str]]:
    return APICall("GET", f"/evaluation/v1/benchmarks/{path_id(benchmark)}/training-pool", _pool_rows)


def upload_harness_call(source: HarnessSource) -> APICall[Harness]:
    return APICall("POST", "/evaluation/v1/harnesses", parse_object(Harness), content=_archive(source),
                   content_type=ARCHIVE_CONTENT_TYPE)


def harnesses_call() -> APICall[ObjectList[Harness]]:
    return APICall("GET", "/evaluation/v1/harnesses", parse_list(Harness))


def run_call(benchmark: str, model: str, split: str, harness: str, attempts: int,
             sampling: Mapping[str, Any] | None, tasks: list[str] | None, limit: int | None,
             experiment: str | None = None) -> APICall[EvaluationJob]:
    body = drop_none({"benchmark": benchmark, "model": model, "split": split, "harness": harness,
                      "attempts": attempts, "sampling": dict(sampling) if sampling is not None else None,
                      "tasks": list(tasks) if tasks is not None else None, "limit": limit,
                      "experiment": experiment})
    return APICall("POST", "/evaluation/v1/jobs", parse_object(EvaluationJob), json=body)


def jobs_call() -> APICall[ObjectList[EvaluationJob]]:
    return APICall("GET", "/evaluation/v1/jobs", parse_list(EvaluationJob))


def get_call(job_id: str) -> APICall[EvaluationJob]:
    return APICall("GET", f"/evaluation/v1/jobs/{path_id(job_id)}", parse_object(EvaluationJob))


def results_call(job_id: str) -> APICall[ObjectList[TrialResult]]:
    return APICall("GET", f"/evaluation/v1/jobs/{path_id(job_id)}/results", parse_list(TrialResult))


def cancel_call(job_id: str) -> APICall[EvaluationJob]:
    return APICall("POST", f"/evaluation/v1/jobs/{path_id(job_id)}/cancel", parse_object(EvaluationJob))


def submit_call(checkpoint: str | None, harness: str | None, base_model: str | None) -> APICall[Submission]:
    body = drop_none({"checkpoint": checkpoint, "harness": harness, "base_model": base_model})
    return APICall("POST", "/evaluation/v1/submissions", parse_object(Submission), json=body)


def submissions_call() -> APICall[ObjectList[Submission]]:
    return APICall("GET", "/evaluation/v1/submissions", parse_list(Submission))


class _Waiter:
    """The I/O-free part of ``wait``: when to report progress and when to give up."""

    def __init__(self, job_id: str, timeout: float | None, on_progress: ProgressCallback | None) -> None:
        self.job_id, self.on_progress = job_id, on_progress
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self._seen: tuple[str, int, int] | None = None

    def observe(self, job: EvaluationJob) -> Any:
        """Report a change to ``on_progress``; returns what the callback returned (maybe awaitable)."""
        state = (job.status, job.progress.done, job.progress.total)
        if state == self._seen or self.on_progress is None:
            self._seen = state
            return None
        self._seen = state
        return self.on_progress(job)

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise APITimeoutError(f"evaluation job {self.job_id} did not finish within {self.timeout:g} s "
                                  "(it keeps running; wait again or cancel it)")


# ---- resources ----------------------------------------------------------------------------


class Evaluation(SyncResource):
    def benchmarks(self) -> ObjectList[Benchmark]:
        """Registered benchmarks and their splits (hidden splits, such as ``official``, left out)."""
        return self._client._request(benchmarks_call())

    def training_pool(self, benchmark: str) -> list[str]:
        """The benchmark's training pool: questions of its form that no task of any split asks
        (its ``training_pool`` is not ``None``). Data built from them is never flagged as
        contamination. :class:`~rsigym.NotFoundError` when the benchmark has none."""
        return self._client._request(training_pool_call(benchmark))

    def upload_harness(self, source: HarnessSource) -> Harness:
        """Upload a harness: a directory (archived with :func:`build_harness_archive`), a ``.tar.gz``
        path, or the archive's bytes. A refused archive (paths outside the tree, no ``harness.toml``,
        too big, …) is :class:`~rsigym.UnprocessableEntityError` naming the offending member."""
        return self._client._request(upload_harness_call(source))

    def harnesses(self) -> ObjectList[Harness]:
        """This run's uploaded harnesses."""
        return self._client._request(harnesses_call())

    def run(self, benchmark: str, model: str, split: str = "dev", harness: str = MINIMAL_HARNESS, attempts: int = 1,
            sampling: Mapping[str, Any] | None = None, tasks: list[str] | None = None,
            limit: int | None = None, experiment: str | None = None) -> EvaluationJob:
        """Start an evaluation job and return it at once (``queued``); see :meth:`wait`.

        ``model`` is a base model or one of the run's checkpoints; ``harness`` is ``minimal`` or an
        uploaded harness id; ``sampling`` may set ``temperature``, ``top_p``, ``max_tokens``,
        ``seed``; ``tasks`` picks task ids of the split and ``limit`` keeps the first N.
        ``experiment`` attaches the job to one of this key's experiments (default: the evaluated
        checkpoint's experiment when it is this key's, else a new one)."""
        return self._client._request(run_call(benchmark, model, split, harness, attempts, sampling, tasks, limit,
                                              experiment))

    def jobs(self) -> ObjectList[EvaluationJob]:
        """This run's evaluation jobs, oldest first."""
        return self._client._request(jobs_call())

    def get(self, job_id: str) -> EvaluationJob:
        return self._client._request(get_call(job_id))

    def wait(self, job_id: str, *, poll_s: float = 1.0, timeout: float | None = None,
             on_progress: ProgressCallback | None = None) -> EvaluationJob:
        """Poll until the job is ``succeeded``, ``failed`` or ``cancelled`` and return it.

        ``on_progress(job)`` is called whenever its status or progress changes. When ``timeout``
        seconds pass first, :class:`~rsigym.APITimeoutError` is raised (the job keeps running)."""
        waiter = _Waiter(job_id, timeout, on_progress)
        while True:
            job = self.get(job_id)
            waiter.observe(job)
            if job.done:
                return job
            waiter.check_deadline()
            time.sleep(poll_s)

    def results(self, job_id: str) -> ObjectList[TrialResult]:
        """Per-trial results (task, attempt, reward, trajectory, outputs). A key that sees aggregate
        results only gets :class:`~rsigym.PermissionDeniedError`."""
        return self._client._request(results_call(job_id))

    def cancel(self, job_id: str) -> EvaluationJob:
        """Stop a job: queued trials do not start; finished trials keep their results."""
        return self._client._request(cancel_call(job_id))


class AsyncEvaluation(AsyncResource):
    async def benchmarks(self) -> ObjectList[Benchmark]:
        return await self._client._request(benchmarks_call())

    async def training_pool(self, benchmark: str) -> list[str]:
        return await self._client._request(training_pool_call(benchmark))

    async def upload_harness(self, source: HarnessSource) -> Harness:
        return await self._client._request(upload_harness_call(source))

    async def harnesses(self) -> ObjectList[Harness]:
        return await self._client._request(harnesses_call())

    async def run(self, benchmark: str, model: str, split: str = "dev", harness: str = MINIMAL_HARNESS,
                  attempts: int = 1, sampling: Mapping[str, Any] | None = None, tasks: list[str] | None = None,
                  limit: int | None = None, experiment: str | None = None) -> EvaluationJob:
        return await self._client._request(run_call(benchmark, model, split, harness, attempts, sampling, tasks, limit,
                                                    experiment))

    async def jobs(self) -> ObjectList[EvaluationJob]:
        return await self._client._request(jobs_call())

    async def get(self, job_id: str) -> EvaluationJob:
        return await self._client._request(get_call(job_id))

    async def wait(self, job_id: str, *, poll_s: float = 1.0, timeout: float | None = None,
                   on_progress: Callable[[EvaluationJob], Any | Awaitable[Any]] | None = None) -> EvaluationJob:
        """As :meth:`Evaluation.wait`; ``on_progress`` may be a coroutine function."""
        waiter = _Waiter(job_id, timeout, on_progress)
        while True:
            job = await self.get(job_id)
            reported = waiter.observe(job)
            if inspect.isawaitable(reported):
                await reported
            if job.done:
                return job
            waiter.check_deadline()
            await asyncio.sleep(poll_s)

    async def results(self, job_id: str) -> ObjectList[TrialResult]:
        return await self._client._request(results_call(job_id))

    async def cancel(self, job_id: str) -> EvaluationJob:
        return await self._client._request(cancel_call(job_id))
