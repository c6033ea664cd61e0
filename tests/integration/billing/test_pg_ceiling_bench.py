"""The PostgreSQL bounds the ledger bench reads its cells against (bench/_pg_ceiling.py): pgbench
runs the ledger's own statements on a key, and leaves that key as whole pairs, every hold it took
settled. One caller's form commits each statement on its own, as one caller's reservation and
settlement are committed."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from access.keys import KeyRegistry
from access.presets import preset_policy
from bench._pg_ceiling import one_caller_ceiling, one_caller_script, server_ceiling
from kit.config import GymConfig
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry
from tests.conftest import PG_URL

ESTIMATE, ACTUAL = 1_000, 700


@pytest.fixture
def pgbench() -> None:
    if shutil.which("pgbench") is None:
        pytest.skip("pgbench is not installed (the bench prints 'no pgbench' then)")


@pytest.mark.usefixtures("pgbench")
@pytest.mark.parametrize("ceiling", [one_caller_ceiling, server_ceiling], ids=["one caller", "pipelined"])
def test_pgbench_leaves_its_key_with_every_hold_settled(
        pg_store: Store, ceiling: Callable[..., float | None]) -> None:
    key = KeyRegistry(pg_store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=10**12)[0]["id"]

    rate = ceiling(pg_store, PG_URL, key, ESTIMATE, ACTUAL, 1)

    assert rate is not None and rate > 0
    with pg_store.transaction() as s:
        spent, reserved = s.execute(select(ApiKey.spent_nusd, ApiKey.reserved_nusd).where(ApiKey.id == key)).one()
        by_status = dict(s.execute(select(LedgerEntry.status, func.count()).where(LedgerEntry.key_id == key)
                                   .group_by(LedgerEntry.status)).tuples().all())
    assert by_status.keys() == {"settled"}  # no hold left open: each close found its own hold's row
    assert reserved == 0
    assert spent == by_status["settled"] * ACTUAL


def test_one_callers_script_commits_the_hold_before_sending_the_close(pg_store: Store) -> None:
    """Each statement on its own line and in no transaction block or pipeline: pgbench
    autocommits each, and waits for its answer before sending the next."""
    lines = one_caller_script(pg_store, "key_x", ESTIMATE, ACTUAL).splitlines()

    assert [line.split()[0] for line in lines] == ["\\set", "WITH", "WITH"]
    assert "held AS" in lines[1] and "closed AS" in lines[2]
    assert not any(word in line for line in lines for word in ("BEGIN", "COMMIT", "pipeline"))
