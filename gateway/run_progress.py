"""Key views with their run's lifecycle carried past ``ended``: whether the run has been audited
(the records service's audits) and scored (evaluation's scores), read through the services' read
modules (access/lifecycle.py derives the state; access/keys.py ``with_progress``)."""

from __future__ import annotations

from typing import Any

from access.keys import with_progress
from services.evaluation import read as evaluation
from services.records import read as records
from storage.store import Store


def with_run_progress(store: Store, views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ended = {v["run_id"] for v in views if v.get("ended")}
    if not ended:
        return views
    with store.transaction() as s:
        audited, scored = records.audited_runs(s, ended), evaluation.scored_runs(s, ended)
    return [with_progress(v, audited=v["run_id"] in audited, scored=v["run_id"] in scored) for v in views]
