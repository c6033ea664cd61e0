"""1,000 concurrent reservations on one key (SQLite file and PostgreSQL): the budget holds.

The 1,000-caller variant of ``test_concurrent_reservations_never_overspend`` (test_ledger.py):
every caller holds its reservation until all have tried, so the budget is contended by all
1,000 at once; then everything held is settled, concurrently too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from billing.ledger import Ledger
from kit.errors import BudgetExhausted
from kit.settings import StoreSettings
from storage.store import Store, sqlite_url
from storage.tables import LedgerEntry
from tests.conftest import PG_URL
from tests.integration.billing.test_ledger import account, ledger_sum, make_key

CALLERS = 1000
BUDGET = 2_000  # nano-USD: covers about a quarter of the calls


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """conftest's ``store``, with a patient connection pool: 1,000 threads queue for its 40
    connections, and on a loaded box the last can wait longer than the default 10 s
    (``pool_timeout_s``, after which the store fails closed with 503). The gateway never queues
    there (Store.call admits only as many threads as the pool holds); this test is about money."""
    settings = StoreSettings(pool_timeout_s=300)
    if request.param == "sqlite":
        s = Store(sqlite_url(tmp_path), settings)
    else:
        s = Store(PG_URL, settings, schema=request.getfixturevalue("pg_schema"))
    s.migrate()
    yield s
    s.dispose()


def estimate_of(n: int) -> int:
    return 5 + n % 7  # 5..11 nano-USD: mixed sizes, so the refusals are not all alike


def actual_of(n: int) -> int:
    return estimate_of(n) - n % 3  # at or under the hold: charged exactly


def run_threads(target: Callable[[int], None], ns: Iterable[int]) -> None:
    threads = [threading.Thread(target=target, args=(n,)) for n in ns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_1000_concurrent_reservations_never_overspend(store: Store) -> None:
    ledger = Ledger(store)
    key = make_key(store, BUDGET)
    held: dict[int, str] = {}
    refused: dict[int, BudgetExhausted] = {}
    other: list[BaseException] = []
    all_tried = threading.Barrier(CALLERS, timeout=120)
    start = threading.Barrier(CALLERS, timeout=120)

    def reserve(n: int) -> None:
        start.wait()  # all 1,000 race for the budget together
        try:
            held[n] = ledger.reserve(key, service="rollout", operation="x", estimate_nusd=estimate_of(n)).id
        except BudgetExhausted as err:
            refused[n] = err
        except BaseException as err:
            other.append(err)
        finally:
            all_tried.wait()  # nobody settles (frees budget) before every caller has tried

    run_threads(reserve, range(CALLERS))
    assert other == []
    assert len(held) + len(refused) == CALLERS
    assert held and refused  # the budget covered some, not all
    held_total = sum(estimate_of(n) for n in held)
    assert held_total <= BUDGET
    # Budget only shrank during the race, so each refusal was right: what is left cannot pay any of them.
    assert BUDGET - held_total < min(estimate_of(n) for n in refused)
    assert all(type(err) is BudgetExhausted and err.message.startswith("budget exhausted") for err in refused.values())
    assert account(store, key) == (0, held_total)

    def settle(n: int) -> None:
        try:
            assert ledger.settle(held[n], actual_of(n)) == actual_of(n)
        except BaseException as err:
            other.append(err)

    run_threads(settle, list(held))
    assert other == []
    spent = sum(actual_of(n) for n in held)
    assert account(store, key) == (spent, 0)
    assert ledger_sum(store, key) == spent
    with store.transaction() as s:
        rows = dict(s.execute(select(LedgerEntry.id, LedgerEntry.status).where(LedgerEntry.key_id == key)).all())
        open_rows = s.scalar(select(func.count()).where(LedgerEntry.status == "reserved"))
    assert rows == {rid: "settled" for rid in held.values()}  # one row per hold, none lost, none for a refusal
    assert open_rows == 0
