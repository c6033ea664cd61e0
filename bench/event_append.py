"""Record-event append: one event appended to a run's hash chain and committed, as every recorded
action does (a sandbox's end, a training job's, an evaluation's …).

Four ways, interleaved, on SQLite and on PostgreSQL (a fresh schema, dropped afterwards):
  * **unanchored** — the baseline: ``EventLog.append`` as the gym called it before the chain's
    head was anchored outside the store (the log's own store, prepared statements);
  * **anchored** — as the gym calls it now: the same, and the committed head handed to the anchor
    (services/records/record_anchor.py: the data dir's file on SQLite, Redis on PostgreSQL), which
    its writer thread makes durable in batches;
  * **anchored+wait** — the same, then waiting until the anchor holds the head durably (what an
    append would cost if it wrote the anchor itself before returning);
  * **core** — the same log given a session of a store that is not its own runs the same four
    statements through the session's connection (SQLAlchemy Core execution; the baseline of the
    prepared path, docs/performance.md).
Every chain is verified at the end, the anchored ones against their anchor. (An earlier append
built its statements per call and ran them through ``Session.execute``: about 3× the prepared
path's time on SQLite and 1.7× on PostgreSQL.)

    .venv/bin/python bench/event_append.py [--events 400] [--store sqlite,postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from _common import PG_URL, ROOT, bench_dir, fresh_pg_schema, summary

from kit.settings import StoreSettings
from services.records.events import TRAINING_JOB, EventLog
from services.records.record_anchor import FILE_NAME, FileAnchor, RecordAnchor, RedisAnchor
from storage.store import Store, sqlite_url

REDIS_URL = os.environ.get("RSIGYM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
MODES = ("unanchored", "anchored", "anchored+wait", "core")


@contextlib.contextmanager
def store_of(kind: str) -> Iterator[tuple[Store, Path]]:
    if kind == "sqlite":
        with bench_dir() as data:
            store = Store(sqlite_url(data), StoreSettings())
            store.migrate()
            yield store, data
            store.dispose()
        return
    with fresh_pg_schema() as schema, bench_dir() as data:
        store = Store(PG_URL, StoreSettings(), schema=schema)
        store.migrate()
        yield store, data
        store.dispose()


@contextlib.contextmanager
def anchor_of(kind: str, data: Path, secret: str) -> Iterator[RecordAnchor]:
    """The gym's anchor for the store: the file in the data dir (SQLite, embedded) or Redis."""
    if kind == "sqlite":
        anchor = RecordAnchor(FileAnchor(data / FILE_NAME, secret))
        yield anchor
        anchor.close()
        return
    namespace = "bench" + secrets.token_hex(4)
    backend = RedisAnchor(REDIS_URL, secret, namespace=namespace, prefix="rsigym-bench:record-anchor:", timeout_s=2)
    anchor = RecordAnchor(backend)
    try:
        yield anchor
    finally:
        anchor.close()
        client = backend._client  # noqa: SLF001 - the bench cleans up its own keys
        for key in client.scan_iter(f"rsigym-bench:record-anchor:{namespace}:*"):
            client.delete(key)
        backend.close()


def one(store: Store, log: EventLog, run_id: str, i: int, wait: bool = False) -> float:
    t0 = time.perf_counter()
    with store.transaction() as s:
        log.append(s, run_id=run_id, kind=TRAINING_JOB, key_id="key_bench",
                   data={"job_id": f"ftjob_{i}", "status": "succeeded", "steps": 800, "loss": 0.42})
    if wait:
        assert log.anchor is not None and log.anchor.flush(10)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--store", default="sqlite,postgres")
    args = parser.parse_args()
    secret = secrets.token_hex(16)
    for kind in args.store.split(","):
        with store_of(kind) as (store, data), store_of("sqlite") as (elsewhere, _), \
                anchor_of(kind, data, secret) as anchor:
            logs = {"unanchored": EventLog(store, secret), "anchored": EventLog(store, secret, anchor=anchor),
                    "anchored+wait": EventLog(store, secret, anchor=anchor), "core": EventLog(elsewhere, secret)}
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            for i in range(20):  # warm up: statements compiled, connections pooled, the anchor's thread started
                for mode in MODES:
                    one(store, logs[mode], f"run_warm_{mode}", i, wait=mode == "anchored+wait")
            for i in range(args.events):  # interleaved, so load on the box hits every way alike
                for mode in MODES:
                    times[mode].append(one(store, logs[mode], f"run_{mode}", i, wait=mode == "anchored+wait"))
            for mode in MODES:
                for run_id in (f"run_warm_{mode}", f"run_{mode}"):
                    report = logs[mode].verify(run_id)
                    anchored = mode.startswith("anchored")
                    if not report.ok or (report.anchor["status"] == "ok") != anchored:
                        raise SystemExit(f"{kind}: the chain of {run_id} does not verify: {report.view()}")
            where = anchor.where
        print(f"record-event append + commit, {args.events} each, {kind} (anchor: {where})")
        for mode in MODES:
            print(f"  {mode:<16}: {summary(times[mode])}")
        p50 = {mode: sorted(v)[len(v) // 2] for mode, v in times.items()}
        print(f"  ratio p50 anchored/unanchored {p50['anchored'] / p50['unanchored']:.2f}x, "
              f"anchored+wait/unanchored {p50['anchored+wait'] / p50['unanchored']:.2f}x, "
              f"unanchored/core {p50['unanchored'] / p50['core']:.2f}x; every chain verified")


if __name__ == "__main__":
    assert ROOT
    main()
