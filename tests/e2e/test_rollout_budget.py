"""Acceptance: 200 concurrent rollout calls on a budget that covers exactly 50."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from kit.settings import StoreSettings
from services.rollout.metering import estimate_chat
from storage.store import Store
from storage.tables import LedgerEntry
from tests.conftest import PG_URL, admin_headers, bearer, gym_config
from tests.fakes.servers import serve_gym

BODY = {"model": "teacher", "messages": [{"role": "user", "content": "Tell me about research."}], "max_tokens": 8}


async def _fire(url: str, key: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        return await asyncio.gather(*(client.post("/rollout/v1/chat/completions", json=BODY, headers=bearer(key)) for _ in range(n)))


def _run(make_gym: Any, standin: Any, store: Store | None) -> None:
    # The reservation bounds the prompt (UTF-8 bytes + framing), so it is above the prompt the
    # provider bills; with prompts free and all max_tokens generated, a call costs exactly its
    # reservation and the budget covers exactly 50 calls, whatever the order they settle in.
    config = gym_config(standin[0])
    config.rollout.models[0].input_usd_per_mtok = 0.0
    gym = make_gym(store, config=config)
    per_call = estimate_chat(BODY, gym.gateway.context)
    budget_usd = 50 * per_call / 1e9
    served_before = len(standin[1].state.requests)
    with serve_gym(gym) as url, httpx.Client(base_url=url) as client:
        created = client.post(
            "/admin/v1/keys",
            json={"policy": {"services": {"rollout": {}}}, "budget_usd": budget_usd},
            headers=admin_headers(),
        ).json()
        responses = asyncio.run(_fire(url, created["key"], 200))
        statuses = Counter(r.status_code for r in responses)
        assert statuses == {200: 50, 402: 150}, statuses
        assert {r.json()["error"]["type"] for r in responses if r.status_code == 402} == {"budget_exhausted"}
        for r in responses:
            if r.status_code == 200:
                assert float(r.headers["X-RSIGym-Cost-USD"]) == pytest.approx(per_call / 1e9)
                assert float(r.headers["X-RSIGym-Remaining-USD"]) >= 0
        balance = client.get("/v1/balance", headers=bearer(created["key"])).json()
        rows = client.get(f"/admin/v1/keys/{created['id']}/ledger", headers=admin_headers()).json()["data"]
    assert balance["spent_usd"] <= balance["budget_usd"]
    assert balance["reserved_usd"] == 0 and balance["remaining_usd"] >= 0
    assert balance["spent_usd"] == pytest.approx(sum(r["actual_usd"] or 0 for r in rows), abs=1e-12)
    assert len(rows) == 50 and {r["status"] for r in rows} == {"settled"}
    # Exact in integers, straight from the store.
    with gym.gateway.store.transaction() as s:
        total = s.scalar(select(func.sum(LedgerEntry.actual_nusd)).where(LedgerEntry.run_id == created["id"]))
    assert total == 50 * per_call
    # Refused calls never reached the provider.
    assert len(standin[1].state.requests) - served_before == 50


def test_exactly_fifty_of_200_concurrent_calls_on_sqlite(make_gym: Any, standin: Any) -> None:
    _run(make_gym, standin, None)


def test_exactly_fifty_of_200_concurrent_calls_on_postgres(make_gym: Any, standin: Any, pg_schema: str) -> None:
    store = Store(PG_URL, StoreSettings(), schema=pg_schema)
    store.migrate()
    try:
        _run(make_gym, standin, store)
    finally:
        store.dispose()
