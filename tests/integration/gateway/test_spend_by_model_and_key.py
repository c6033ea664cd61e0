"""Spend per model and per key (issue 55, item 9), as LiteLLM users read it: calls on three models
(two catalogue models and the tiny base model) with two keys; every ledger row carries its model,
and ``/metrics`` (``rsigym_model_spend_usd_total``, ``rsigym_key_spend_usd_total``) and
``GET /admin/v1/spend`` show exactly what the ledger charged, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from billing import spend
from ops.builder import Gym
from storage.store import Store
from tests.conftest import admin_headers, bearer, client_for, create_key

CALLS = [("a", "rollout", "teacher"), ("a", "rollout", "judge"), ("b", "rollout", "judge"),
         ("b", "rollout", "judge"), ("b", "inference", "tiny")]


def _samples(text: str, family: str) -> dict[tuple[str, ...], float]:
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            labels = {"rsigym_model_spend_usd": ("model", "service"),
                      "rsigym_key_spend_usd": ("key_id", "key_name", "run_id", "model")}[family]
            return {tuple(s.labels[k] for k in labels): s.value for s in metric.samples if s.name.endswith("_total")}
    return {}


def test_spend_by_model_and_by_key_equals_the_ledger(make_gym: Callable[..., Gym], store: Store) -> None:
    client = client_for(make_gym(store))
    keys = {"a": create_key(client, 1.0, name="alpha"), "b": create_key(client, 1.0, name="beta")}
    charged: dict[tuple[str, str], float] = defaultdict(float)  # (key id, model) → X-RSIGym-Cost-USD
    for who, service, model in CALLS:
        body = {"model": model, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 3}
        r = client.post(f"/{service}/v1/chat/completions", json=body, headers=bearer(keys[who]["key"]))
        assert r.status_code == 200, r.text
        charged[keys[who]["id"], model] += float(r.headers["X-RSIGym-Cost-USD"])
    assert all(usd > 0 for usd in charged.values())

    # The ledger: every row names its model, and sums to what the calls were charged.
    from_ledger: dict[tuple[str, str], float] = defaultdict(float)
    for made in keys.values():
        rows = client.get(f"/admin/v1/keys/{made['id']}/ledger", headers=admin_headers()).json()["data"]
        assert {r["status"] for r in rows} == {"settled"}
        for r in rows:
            from_ledger[r["key_id"], r["model"]] += r["actual_usd"]
    assert from_ledger.keys() == charged.keys()
    for pair, usd in charged.items():
        assert from_ledger[pair] == pytest.approx(usd, abs=1e-9)

    # /metrics: per key and model, per model and service.
    text = client.get("/metrics", headers=admin_headers()).text
    per_key = _samples(text, "rsigym_key_spend_usd")
    assert len(per_key) == len(charged)
    for (key_id, model), usd in charged.items():
        name = "alpha" if key_id == keys["a"]["id"] else "beta"
        assert per_key[key_id, name, key_id, model] == pytest.approx(usd, abs=1e-9)
    per_model = _samples(text, "rsigym_model_spend_usd")
    expected_model: dict[tuple[str, str], float] = defaultdict(float)
    for (_key, model), usd in charged.items():
        expected_model[model, "inference" if model == "tiny" else "rollout"] += usd
    assert per_model.keys() == expected_model.keys()
    for pair, usd in expected_model.items():
        assert per_model[pair] == pytest.approx(usd, abs=1e-9)
    assert "sk-" not in "".join(k for labels in per_key for k in labels)  # ids, never secrets

    # The admin API: by model, by key, one run's.
    answer: dict[str, Any] = client.get("/admin/v1/spend", params={"by": "model"}, headers=admin_headers()).json()
    assert {(d["model"], d["service"]): d["charged_usd"] for d in answer["data"]} == pytest.approx(dict(expected_model))
    assert answer["total_usd"] == pytest.approx(sum(charged.values()), abs=1e-9)
    judge = next(d for d in answer["data"] if d["model"] == "judge")
    assert judge["calls"] == 3
    one_run = client.get("/admin/v1/spend", params={"by": "key", "run_id": keys["b"]["id"]},
                         headers=admin_headers()).json()
    assert {(d["key_id"], d["key_name"], d["model"]): d["charged_usd"] for d in one_run["data"]} == pytest.approx(
        {(k, "beta", m): usd for (k, m), usd in charged.items() if k == keys["b"]["id"]})
    assert client.get("/admin/v1/spend", params={"by": "team"}, headers=admin_headers()).status_code == 422


def test_series_past_the_bound_are_summed_under_other() -> None:
    """A bounded export keeps the most charged pairs and folds the rest into ``other``: totals stay exact."""
    rows = [spend.Charged(f"key_{i}", f"key_{i}", "teacher", "rollout", 10 * (i + 1), 1) for i in range(5)]
    kept = spend.by_key(rows, limit=2)
    assert [(d["key_id"], d["charged_nusd"]) for d in kept] == [("key_4", 50), ("key_3", 40), ("other", 60)]
    assert kept[-1]["model"] == "other" and kept[-1]["calls"] == 3
    models = spend.by_model([*rows, spend.Charged("key_9", "key_9", "", "sandbox", 7, 2)], limit=1)
    assert [(d["model"], d["service"], d["charged_nusd"]) for d in models] == [
        ("teacher", "rollout", 150), ("other", "sandbox", 7)]
