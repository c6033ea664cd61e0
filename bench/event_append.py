"""Record-event append: one event appended to a run's hash chain and committed, as every recorded
action does (a sandbox's end, a training job's, an evaluation's …).

Two ways, interleaved, on SQLite and on PostgreSQL (a fresh schema, dropped afterwards):
  * **prepared** — ``EventLog.append`` as the gym calls it: the session is on the log's own store,
    so its four statements run prepared on the transaction's own connection;
  * **core** — the baseline: the same log given a session of a store that is not its own runs
    the same four statements through the session's connection (SQLAlchemy Core execution).
Both chains are verified at the end. (The append before 2026-12-04 built its statements per call
and ran them through ``Session.execute``: 2.07 ms p50 on SQLite and 4.57 on PostgreSQL where the
prepared path took 0.69 and 2.63 in the same run; docs/performance.md.)

    .venv/bin/python bench/event_append.py [--events 400] [--store sqlite,postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import time
from collections.abc import Iterator

from _common import PG_URL, ROOT, bench_dir, fresh_pg_schema, summary

from services.core.events import TRAINING_JOB, EventLog
from services.core.settings import StoreSettings
from services.core.store import Store, sqlite_url


@contextlib.contextmanager
def store_of(kind: str) -> Iterator[Store]:
    if kind == "sqlite":
        with bench_dir() as data:
            store = Store(sqlite_url(data), StoreSettings())
            store.migrate()
            yield store
            store.dispose()
        return
    with fresh_pg_schema() as schema:
        store = Store(PG_URL, StoreSettings(), schema=schema)
        store.migrate()
        yield store
        store.dispose()


def one(store: Store, log: EventLog, run_id: str, i: int) -> float:
    t0 = time.perf_counter()
    with store.transaction() as s:
        log.append(s, run_id=run_id, kind=TRAINING_JOB, key_id="key_bench",
                   data={"job_id": f"ftjob_{i}", "status": "succeeded", "steps": 800, "loss": 0.42})
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--store", default="sqlite,postgres")
    args = parser.parse_args()
    secret = secrets.token_hex(16)
    for kind in args.store.split(","):
        with store_of(kind) as store, store_of("sqlite") as elsewhere:
            prepared, through_core = EventLog(store, secret), EventLog(elsewhere, secret)
            fast, slow = [], []
            for i in range(20):  # warm up: statements compiled, connections pooled
                one(store, prepared, "run_warm", i)
                one(store, through_core, "run_warm", i)
            for i in range(args.events):  # interleaved, so load on the box hits both alike
                fast.append(one(store, prepared, "run_prepared", i))
                slow.append(one(store, through_core, "run_core", i))
            for run_id in ("run_warm", "run_prepared", "run_core"):
                report = prepared.verify(run_id)
                if not report.ok:
                    raise SystemExit(f"{kind}: the chain of {run_id} does not verify: {report.problems[:3]}")
        print(f"record-event append + commit, {args.events} each, {kind}")
        print(f"  prepared (now)     : {summary(fast)}")
        print(f"  core (baseline)    : {summary(slow)}")
        print(f"  ratio p50 prepared/core {sorted(fast)[len(fast) // 2] / sorted(slow)[len(slow) // 2]:.2f}x; "
              "every chain verified")


if __name__ == "__main__":
    assert ROOT
    main()
