"""Migrations run once under a lock: N replica processes starting together on a fresh
PostgreSQL schema all come up, and the schema is migrated exactly once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from kit.settings import StoreSettings
from storage.store import Store, alembic_config
from tests.conftest import PG_URL

REPLICAS = 4
REPLICA = """
import sys, time
from pathlib import Path
from kit.settings import StoreSettings
from storage.store import Store
store = Store(sys.argv[1], StoreSettings(pool_size=1, max_overflow=0), schema=sys.argv[2])
go = Path(sys.argv[3])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
store.migrate()
store.dispose()
print("migrated", flush=True)
"""


@pytest.mark.postgres
def test_replicas_migrating_a_fresh_schema_together_all_succeed_once(pg_schema: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", REPLICA, PG_URL, pg_schema, str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(REPLICAS)]
    try:
        for proc in procs:  # every replica has imported everything and holds an engine: start together
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.stderr
        go.touch()
        results = [proc.communicate(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [err[-2000:] for proc, (_out, err) in zip(procs, results, strict=True) if proc.returncode != 0]
    assert failed == [], f"{len(failed)} of {REPLICAS} replicas failed to migrate:\n{failed[0]}"
    assert all(out.strip() == "migrated" for out, _err in results)

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    store = Store(PG_URL, StoreSettings(), schema=pg_schema)
    try:
        with store.transaction() as s:
            assert s.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head]
            tables = s.execute(text("SELECT count(*) FROM information_schema.tables WHERE table_schema = :s"),
                               {"s": pg_schema}).scalar_one()
        assert tables > 5
        store.migrate()  # a later replica finds nothing to do
        with store.transaction() as s:
            assert s.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head]
    finally:
        store.dispose()
