"""Integrity checks while a run is live: each new dataset scanned for contamination when it is
registered, each submission's provenance checked when it is made; the results kept for the
operator only.

The post-run audit (services/records/audits/run.py) runs the same checks once the run is over;
here they run as the run goes, so the operator sees a contaminated upload within seconds
(``rsigym watch``, the dashboard's run page, ``rsigym_contamination_hits_total`` and its
Prometheus alert) and can act on it while the agent is still at work.

**Nothing of it reaches the agent.** A contamination hit is a statement about the hidden tasks:
any signal the uploading run could read — a status, a refusal, a pause, a slower answer — would
tell it which of its candidate rows are hidden tasks (the oracle the audit's agent view closes,
services/records/audits/agent_view.py). So:

* the check runs off the request path, on one background thread per service process: the
  upload's answer is built and sent before the scan starts, whatever the scan finds;
* the result is an :class:`~services.records.tables.IntegrityCheck` row, never a platform event
  (events are the run's own record, which its keys read), and no route a run key reaches reads
  that table; the run is neither paused nor ended, and its experiments' statuses are untouched
  (those change only when the operator audits).

Provenance at submission is recorded the same way, not refused. A provenance problem says nothing
about hidden tasks, so a refusal would leak nothing about them; but it would tell the agent which
substitutions the check catches (try another until one is accepted), a transient problem (weights
not yet visible on a shared volume, an anchor that lags) would block an honest submission, and
hashing a large checkpoint's weights does not belong on the request path. The audit still flags
the run; the operator sees the failure at once.

A scan covers the uploaded rows only (the matcher and its text are the audit's:
services/records/audits/contamination.py, services/models/training_text.py); custom losses and
benchmarks registered later are the post-run audit's. A process that stops with checks queued
loses them (the audit still scans every dataset of the submitted lineage).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.config import GymConfig
from kit.ids import new_id
from services.records.events import EventLog
from services.records.tables import IntegrityCheck
from storage.store import Store

log = logging.getLogger("rsigym.integrity")

CONTAMINATION = "contamination"
PROVENANCE = "provenance"
MAX_MATCHES = 50
"""Matched excerpts kept per scan (the overlap still counts every match)."""


@dataclass
class LiveIntegrity:
    """The live checks of one service process; :meth:`dataset_registered` and
    :meth:`submission_created` return at once and check on the background thread."""

    store: Store
    config: GymConfig
    data_dir: Path
    events: EventLog
    _pool: ThreadPoolExecutor = field(init=False, repr=False)
    _pending: list[Future[Any]] = field(init=False, default_factory=list, repr=False)
    _items: tuple[tuple[tuple[str, int], ...], list[Any]] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsigym-integrity")

    # -- hooks (the request path: constant time, no result) ----------------------------------

    def dataset_registered(self, *, run_id: str, dataset_id: str, sha256: str) -> None:
        """Scan a newly registered dataset (an upload or a Tinker loop record) in the background."""
        self._submit(self.scan_dataset, run_id=run_id, dataset_id=dataset_id, sha256=sha256, since=time.monotonic())

    def submission_created(self, *, run_id: str, submission: dict[str, Any]) -> None:
        """Check a new submission's provenance in the background."""
        self._submit(self.check_submission, run_id=run_id, submission=dict(submission), since=time.monotonic())

    def _submit(self, fn: Any, **kwargs: Any) -> None:
        try:
            future = self._pool.submit(self._logged, fn, kwargs)
        except RuntimeError:  # shut down: the post-run audit still checks it
            return
        self._pending = [f for f in self._pending if not f.done()] + [future]

    @staticmethod
    def _logged(fn: Any, kwargs: dict[str, Any]) -> None:
        try:
            fn(**kwargs)
        except Exception:  # noqa: BLE001 - a failed live check must never reach the caller; the audit still runs
            log.exception("live integrity check %s failed for run %s", fn.__name__, kwargs.get("run_id"))

    def wait(self, timeout: float | None = None) -> None:
        """Until the checks queued so far have run (tests, shutdown)."""
        for future in list(self._pending):
            future.exception(timeout=timeout)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the checks --------------------------------------------------------------------------

    def _benchmark_items(self) -> list[Any]:
        """Every registered benchmark's items (as ``benchmark_items(store)`` reads them), loaded again
        only when the registered copies change."""
        from services.evaluation.benchmarks import load_benchmark
        from services.evaluation.read import registered_benchmark_paths
        from services.records.audits.contamination import task_items

        paths = registered_benchmark_paths(self.store)
        key = tuple((p, Path(p).stat().st_mtime_ns if Path(p).exists() else 0) for p in paths)
        if self._items is None or self._items[0] != key:
            self._items = (key, [i for p in paths for i in task_items(load_benchmark(p))])
        return self._items[1]

    def scan_dataset(self, *, run_id: str, dataset_id: str, sha256: str, since: float | None = None) -> dict[str, Any]:
        """Scan one dataset blob against every registered benchmark (the audit's matcher) and record it."""
        from services.records.audits.contamination import dataset_rows, scan

        cfg = self.config.audit
        path = self.data_dir / "datasets" / f"{sha256}.jsonl"
        report: dict[str, Any] = {"dataset_id": dataset_id, "sha256": sha256, "n": cfg.ngram,
                                  "threshold": cfg.contamination_threshold}
        try:
            items = self._benchmark_items()
        except (OSError, ValueError) as err:
            return self._record(run_id, CONTAMINATION, dataset_id, "inconclusive", 0,
                                {**report, "error": f"cannot read the registered benchmarks: {err}"}, since)
        if not items or not path.is_file():
            why = "no registered benchmark" if not items else "the dataset's blob is missing"
            return self._record(run_id, CONTAMINATION, dataset_id, "inconclusive", 0, {**report, "error": why}, since)
        found = scan(dataset_rows(path, dataset_id), items, cfg.ngram, cfg.contamination_threshold,
                     min_item_words=cfg.min_item_words)
        tasks = found.contaminated
        report.update(rows_scanned=found.rows_scanned, bytes_scanned=found.bytes_scanned, contaminated=tasks,
                      overlap={t: round(found.tasks[t].overlap, 4) for t in tasks},
                      matches=[m.view() for t in tasks for m in found.matches_of(t)][:MAX_MATCHES])
        return self._record(run_id, CONTAMINATION, dataset_id, "flag" if tasks else "pass", len(tasks), report, since)

    def check_submission(self, *, run_id: str, submission: dict[str, Any], since: float | None = None) -> dict[str, Any]:
        """The audit's provenance check (services/records/audits/provenance.py) on one submission, recorded."""
        from services.records.audits.context import AuditContext
        from services.records.audits.provenance import check_provenance

        ctx = AuditContext(store=self.store, config=self.config, data_dir=self.data_dir, events=self.events,
                           run_id=run_id)
        result = check_provenance(ctx, submission)
        executed = sum(1 for f in result.findings if f.flags)
        return self._record(run_id, PROVENANCE, str(submission.get("id")), result.verdict, executed,
                            {"submission": submission, **result.view()}, since)

    def _record(self, run_id: str, kind: str, subject: str, verdict: str, hits: int, report: dict[str, Any],
                since: float | None) -> dict[str, Any]:
        seconds = 0.0 if since is None else time.monotonic() - since
        row = IntegrityCheck(id=new_id("ichk"), run_id=run_id, kind=kind, subject=subject, verdict=verdict,
                             hits=hits, report=report, seconds=round(seconds, 3))
        with self.store.transaction() as s:
            s.add(row)
            s.flush()
            view = check_view(row)
        if verdict == "flag":
            log.warning("live integrity: %s of %s in run %s flagged (%d hit(s)) %.1f s after it was made",
                        kind, subject, run_id, hits, seconds)
        return view


def check_view(row: IntegrityCheck) -> dict[str, Any]:
    return {"id": row.id, "run_id": row.run_id, "check": row.kind, "subject": row.subject, "verdict": row.verdict,
            "hits": row.hits, "seconds": row.seconds, "report": row.report, "created_at": row.created_at.isoformat()}
