"""Pipelined batches (storage/group_commit.py ``Pipelined``): on PostgreSQL a batch sends every
run-key reservation's and every settlement's statement before reading any answer; nothing about
money changes for it, and a statement that fails in the middle fails its own caller only.

Each batch is built as in test_group_commit.py: a first caller leads alone and is held inside its
work while the others queue; when it lets go, the next leader takes them all in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from sqlalchemy import exc, func, select, text

from billing.ledger import Ledger
from kit.errors import BudgetExhausted, StoreUnavailable
from storage.group_commit import Pipelined
from storage.store import Store, Work
from storage.tables import LedgerEntry
from tests.integration.billing.test_ledger import account, make_key
from tests.integration.storage.test_group_commit import Callers, held_leader, queued, wait_until

_FAILS = text("SELECT 1 FROM no_such_table WHERE 1 = :by")
"""A statement the server refuses (no such table): on PostgreSQL, once the statements sent
before it have been answered."""


def _sends(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record, for every statement sent, whether it went inside a pipeline."""
    seen: list[bool] = []
    run = Work._run  # every statement of a unit of work goes through it

    def spy(self: Work, stmt: Any, params: dict[str, Any], i: int) -> Any:
        seen.append(self._pipelining)  # noqa: SLF001 - the test checks how statements went
        return run(self, stmt, params, i)

    monkeypatch.setattr(Work, "_run", spy)
    return seen


def _queued_is(store: Store, n: int) -> bool:
    return queued(store) == n


def _queue(store: Store, callers: Callers, calls: dict[str, Callable[[], Any]]) -> None:
    """Start the calls one at a time, in order (a batch runs its units in the order they queued)."""
    for name, call in calls.items():
        callers.start(name, call)
        started = len(callers.threads)
        wait_until(partial(_queued_is, store, started - 1))  # all but the held leader


def test_a_batch_of_reservations_and_settlements_goes_in_one_pipeline_with_the_same_outcomes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Holds, settlements and a refusal in one batch: each caller gets what it would have got one
    at a time, in queue order (the refused hold sees the holds before it), and on PostgreSQL
    every statement of the batch went in one pipeline."""
    ledger = Ledger(store)
    key = make_key(store, 1_000)
    earlier = [ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100, chain_ids=(key,))
               for _ in range(2)]
    sends = _sends(monkeypatch)

    def hold(amount: int) -> Callable[[], Any]:
        return lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=amount, chain_ids=(key,))

    callers = Callers()
    batches = store.group.batches
    with held_leader(store, callers):
        _queue(store, callers, {
            "h1": hold(300),
            "s1": lambda: ledger.settle_with_balance(earlier[0].id, 60),
            "h2": hold(400),
            "refused": hold(300),  # 1,000 - 100 held - 60 spent - 300 - 400 = 140 left
            "s2": lambda: ledger.settle_with_balance(earlier[1].id, 500),  # charged its 100, the rest an overrun
            "again": lambda: ledger.settle_with_balance(earlier[0].id, 60),  # already settled: 0, nothing moves
            "h3": hold(140),  # exactly what is left once s2 freed its hold and spent it
        })
    callers.join()

    assert store.group.batches == batches + 1  # the seven went together
    assert isinstance(callers.errors.pop("refused"), BudgetExhausted)
    assert callers.errors == {}
    got = callers.results
    assert [got[n].balance.remaining_nusd for n in ("h1", "h2", "h3")] == [500, 140, 0]
    assert got["s1"][0] == 60 and got["s1"][1].remaining_nusd == 540
    assert got["s2"][0] == 100 and got["s2"][1].remaining_nusd == 140
    assert got["again"] == (0, None)
    assert account(store, key) == (160, 840)  # spent, reserved: nothing of the refused 300 held
    with store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 5  # 2 earlier + 3 held now
    if store.dialect == "postgresql":
        assert sends[:7] == [True] * 7  # the batch's seven statements: one pipeline
        assert sends[7:] == [False]  # the refusal's own read, after it, one at a time
    else:
        assert not any(sends)  # SQLite: no round trip to save, nothing pipelined


@pytest.mark.parametrize("where", [0, 2, 4])
def test_a_statement_that_fails_inside_a_pipeline_fails_its_caller_alone(store: Store, where: int) -> None:
    """A unit whose statement the server refuses (no such table), first, in the middle or last
    of a pipelined batch: its caller gets that error; every other caller's work is done exactly
    once (the batch is rolled back and run again without it; nothing is held or charged twice)."""
    ledger = Ledger(store)
    key = make_key(store, 10_000)
    earlier = [ledger.reserve(key, service="rollout", operation="x", estimate_nusd=100, chain_ids=(key,))
               for _ in range(2)]

    tries: list[bool] = []

    def failing(work: Work) -> Callable[[], Any]:
        tries.append(work._pipelining)  # noqa: SLF001 - the test checks how its statement went
        sent = work.send(_FAILS, {"by": 0})
        return lambda: sent.first()

    calls: dict[str, Callable[[], Any]] = {
        "h1": lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=1_000, chain_ids=(key,)),
        "s1": lambda: ledger.settle(earlier[0].id, 70),
        "h2": lambda: ledger.reserve(key, service="rollout", operation="x", estimate_nusd=2_000, chain_ids=(key,)),
        "s2": lambda: ledger.settle(earlier[1].id, 30),
    }
    names = list(calls)
    names.insert(where, "failing")
    calls["failing"] = lambda: store.batched(Pipelined(failing))
    callers = Callers()
    with held_leader(store, callers):
        _queue(store, callers, {name: calls[name] for name in names})
    callers.join()

    # A driver error as SQLAlchemy's (SQLite's "no such table" is an OperationalError: the 503 of
    # a store that cannot serve, as for any OperationalError).
    assert isinstance(callers.errors.pop("failing"), exc.DBAPIError | StoreUnavailable)
    assert callers.errors == {}
    # Sent twice: in the batch, then alone (the failed unit, found at once, not by trying the
    # others alone one after another), and on PostgreSQL the first time inside the pipeline.
    assert tries == ([True, False] if store.dialect == "postgresql" else [False, False])
    assert callers.results["s1"] == 70 and callers.results["s2"] == 30
    assert account(store, key) == (100, 3_000)  # 70 + 30 spent; the two new holds, once each
    with store.transaction() as s:
        rows = s.execute(select(LedgerEntry.status, func.count()).group_by(LedgerEntry.status)).all()
    assert dict(rows) == {"settled": 2, "reserved": 2}
    for name in ("h1", "h2"):  # each caller's reservation is the one that was committed
        assert ledger.settle(callers.results[name].id, 0) == 0
    assert account(store, key) == (100, 0)
