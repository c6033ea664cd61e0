"""Spend by model and by key, summed from the ledger: what ``/metrics`` exports
(``rsigym_model_spend_usd_total``, ``rsigym_key_spend_usd_total``, the counterparts of LiteLLM's
``litellm_spend_metric{model, hashed_api_key, api_key_alias}``) and the admin API answers
(``GET /admin/v1/spend?by=model|key``).

Every part that charges writes the ledger (gateway replicas, services, workers), so a sum over it
is the whole gym's spend, whichever replica is asked. Only charged rows count (``settled`` and
``expired``: a released hold cost nothing, an open one is not spent yet). A key is named by its id,
never its secret.

Label cardinality is bounded: a Prometheus series per key and model would grow with every run, so
the export keeps the ``KEY_SERIES_MAX`` (key, model) pairs and the ``MODEL_SERIES_MAX`` (model,
service) pairs that were charged most, and sums the rest under ``other`` — the totals stay exact.
The admin API takes its own ``limit``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

from sqlalchemy import func, select

from billing.money import nusd_to_usd
from storage.store import Store
from storage.tables import ApiKey, LedgerEntry

KEY_SERIES_MAX = 500
"""(key, model) series ``rsigym_key_spend_usd_total`` exports at most; the rest: ``key_id="other"``."""
MODEL_SERIES_MAX = 200
"""(model, service) series ``rsigym_model_spend_usd_total`` exports at most (checkpoint ids are
models too, one per trained checkpoint called); the rest: ``model="other"``."""
OTHER = "other"
CHARGED = ("settled", "expired")


class Charged(NamedTuple):
    """Charged nano-USD and charged rows of one (key, model, service); ``model`` "" where the work
    named none (sandboxes, evaluation work)."""

    key_id: str
    run_id: str
    model: str
    service: str
    nusd: int
    calls: int


def charged(store: Store, run_id: str | None = None) -> list[Charged]:
    """What each (key, model, service) was charged, from the ledger (``run_id``: that run's keys only)."""
    e = LedgerEntry
    query = (select(e.key_id, e.run_id, e.model, e.service, func.sum(e.actual_nusd), func.count())
             .where(e.status.in_(CHARGED)).group_by(e.key_id, e.run_id, e.model, e.service))
    if run_id is not None:
        query = query.where(e.run_id == run_id)
    with store.transaction() as s:
        rows = s.execute(query).all()
    return [Charged(k, r, m or "", svc, int(n or 0), int(c)) for k, r, m, svc, n, c in rows]


def by_model(rows: list[Charged], limit: int = MODEL_SERIES_MAX) -> list[dict[str, Any]]:
    """Spend per (model, service), most first; past ``limit``, one ``other`` row per service."""
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        acc = sums[row.model, row.service]
        acc[0] += row.nusd
        acc[1] += row.calls
    return _bounded(sums, limit, lambda key: (OTHER, key[1]), ("model", "service"))


def by_key(rows: list[Charged], limit: int = KEY_SERIES_MAX) -> list[dict[str, Any]]:
    """Spend per (key, model), most first, with each key's run; past ``limit``, one ``other`` row
    (key, run and model ``other``). :func:`with_names` adds the keys' names."""
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    runs: dict[str, str] = {}
    for row in rows:
        acc = sums[row.key_id, row.model]
        acc[0] += row.nusd
        acc[1] += row.calls
        runs[row.key_id] = row.run_id
    out = _bounded(sums, limit, lambda _key: (OTHER, OTHER), ("key_id", "model"))
    for item in out:
        item["run_id"] = runs.get(item["key_id"], OTHER)
    return out


def with_names(store: Store, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` of :func:`by_key`, each with its key's name (LiteLLM's ``api_key_alias``; "" for none)."""
    ids = sorted({item["key_id"] for item in items} - {OTHER})
    names: dict[str, str | None] = {}
    if ids:
        with store.transaction() as s:
            names = dict(s.execute(select(ApiKey.id, ApiKey.name).where(ApiKey.id.in_(ids))).tuples().all())
    return [{**item, "key_name": names.get(item["key_id"]) or ""} for item in items]


def _bounded(sums: dict[tuple[str, str], list[int]], limit: int, other: Any, labels: tuple[str, str]) -> list[dict[str, Any]]:
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1][0], kv[0]))
    kept, rest = ranked[:limit], ranked[limit:]
    folded: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for key, (nusd, calls) in rest:
        acc = folded[other(key)]
        acc[0] += nusd
        acc[1] += calls
    return [{labels[0]: key[0], labels[1]: key[1], "charged_nusd": nusd, "charged_usd": nusd_to_usd(nusd),
             "calls": calls} for key, (nusd, calls) in [*kept, *folded.items()]]
