"""Operator lists across runs (``GET /admin/v1/<kind>``, ``rsigym list``): every kind filters by
run, key and status, pages newest first on a cursor that does not shift when rows arrive, refuses
bad parameters in the standard error shape, and answers no agent key."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kit.ids import new_id
from ops.admin_lists import KINDS
from ops.cli.main import app as operator_cli
from services.evaluation.tables import EvaluationJob, SubmissionRow
from services.sandbox.tables import SandboxRow
from services.training.checkpoints import Checkpoint
from services.training.tables import Dataset, TrainingJob
from storage.store import Store
from tests.conftest import ADMIN_TOKEN, admin_headers, bearer, create_key
from tests.fakes.servers import serve_gym

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def served(make_gym: Callable[..., Any], store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with serve_gym(make_gym(store=store)) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield url


def add_rows(store: Store, run_id: str, key_id: str, minute: int, status: str = "succeeded") -> dict[str, str]:
    """One row of every kind for the run, made at ``T0 + minute``; their ids by kind."""
    at = T0 + timedelta(minutes=minute)
    ids = {kind: new_id(kind[:3]) for kind in KINDS}
    with store.transaction() as s:
        s.add(Dataset(id=ids["datasets"], run_id=run_id, key_id=key_id, name="d", sha256=new_id("h").ljust(64, "0"),
                      format="chat", rows=3, bytes=120, created_at=at))
        s.add(TrainingJob(id=ids["training-jobs"], run_id=run_id, key_id=key_id, status=status, base_model="tiny",
                          dataset_ids=[ids["datasets"]], config={}, config_hash="0" * 64, total_steps=8, step=8,
                          created_at=at))
        s.flush()
        s.add(Checkpoint(id=ids["checkpoints"], run_id=run_id, job_id=ids["training-jobs"], base_model="tiny",
                         dataset_hashes=[], config_hash="0" * 64, step=8, metrics={}, weights_hash="1" * 64,
                         path="/nowhere", created_at=at))
        s.add(EvaluationJob(id=ids["evaluation-jobs"], run_id=run_id, key_id=key_id, purpose="agent", benchmark="b",
                            split="dev", model=ids["checkpoints"], harness="minimal", attempts=1, sampling={},
                            task_ids=["t"], gateway_url="http://x", status=status, trials_total=1, created_at=at))
        s.add(SandboxRow(id=ids["sandboxes"], run_id=run_id, key_id=key_id, chain_ids=[run_id], template="base",
                         backend="local", state="killed" if status == "succeeded" else "running", started_at=at,
                         end_at=at + timedelta(minutes=5), price_nusd_per_s=1))
        s.add(SubmissionRow(id=ids["submissions"], run_id=run_id, key_id=key_id, track="joint",
                            checkpoint_id=ids["checkpoints"], model=ids["checkpoints"], harness="minimal", created_at=at))
    return ids


def get(c: httpx.Client, kind: str, **params: Any) -> httpx.Response:
    return c.get(f"/admin/v1{KINDS[kind].path}", params=params, headers=admin_headers())


def test_every_kind_filters_by_run_and_key(served: str, store: Store) -> None:
    with httpx.Client(base_url=served) as c:
        a, b = create_key(c, name="a"), create_key(c, name="b")
        child = {"id": new_id("key")}  # a child key of a's (the rows name it; the lists read no key)
        mine = add_rows(store, a["id"], a["id"], 1)
        childs = add_rows(store, a["id"], child["id"], 2)
        theirs = add_rows(store, b["id"], b["id"], 3)
        for kind in KINDS:
            everything = get(c, kind).json()
            assert {mine[kind], childs[kind], theirs[kind]} <= {r["id"] for r in everything["data"]}, kind
            of_a = get(c, kind, run_id=a["id"]).json()
            assert [r["id"] for r in of_a["data"]] == [childs[kind], mine[kind]], kind  # newest first
            assert all(r["run_id"] == a["id"] for r in of_a["data"])
            if kind != "checkpoints":  # a checkpoint belongs to its job and run, not to a key
                assert [r["id"] for r in get(c, kind, key_id=child["id"]).json()["data"]] == [childs[kind]], kind


def test_pages_follow_the_cursor_and_do_not_shift_when_rows_arrive(served: str, store: Store) -> None:
    with httpx.Client(base_url=served) as c:
        run = create_key(c, name="paged")
        made = [add_rows(store, run["id"], run["id"], m)["training-jobs"] for m in range(7)]
        first = get(c, "training-jobs", run_id=run["id"], limit=3).json()
        assert [r["id"] for r in first["data"]] == made[::-1][:3]
        add_rows(store, run["id"], run["id"], 60)  # a newer job arrives between pages
        second = get(c, "training-jobs", run_id=run["id"], limit=3, cursor=first["next_cursor"]).json()
        third = get(c, "training-jobs", run_id=run["id"], limit=3, cursor=second["next_cursor"]).json()
        assert [r["id"] for r in second["data"] + third["data"]] == made[::-1][3:]
        assert third["next_cursor"] is None


def test_status_filters_jobs_and_sandboxes(served: str, store: Store) -> None:
    with httpx.Client(base_url=served) as c:
        run = create_key(c, name="s")
        done = add_rows(store, run["id"], run["id"], 1, status="succeeded")
        running = add_rows(store, run["id"], run["id"], 2, status="running")
        for kind, status, want in (("training-jobs", "running", running), ("evaluation-jobs", "succeeded", done),
                                   ("sandboxes", "running", running), ("sandboxes", "killed", done)):
            rows = get(c, kind, run_id=run["id"], status=status).json()["data"]
            assert [r["id"] for r in rows] == [want[kind]], (kind, status)


@pytest.mark.parametrize(("kind", "params", "param"), [
    ("datasets", {"cursor": "not-a-cursor!"}, "cursor"),
    ("datasets", {"limit": 0}, "limit"),
    ("checkpoints", {"limit": 501}, "limit"),
    ("datasets", {"status": "running"}, "status"),
    ("checkpoints", {"key_id": "key_x"}, "key_id"),
])
def test_bad_parameters_get_the_standard_error(served: str, kind: str, params: dict[str, Any], param: str) -> None:
    with httpx.Client(base_url=served) as c:
        refused = get(c, kind, **params)
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["param"] == param and error["message"]


def test_no_agent_key_reads_the_lists(served: str, store: Store) -> None:
    with httpx.Client(base_url=served) as c:
        a, b = create_key(c, name="a"), create_key(c, name="b")
        theirs = add_rows(store, b["id"], b["id"], 1)
        for kind in KINDS:
            for headers in ({}, bearer(a["key"]), bearer(b["key"])):
                refused = c.get(f"/admin/v1{KINDS[kind].path}", params={"run_id": b["id"]}, headers=headers)
                assert refused.status_code in (401, 403), (kind, refused.status_code)
                assert theirs[kind] not in refused.text


def test_the_cli_lists_across_pages(served: str, store: Store) -> None:
    with httpx.Client(base_url=served) as c:
        run = create_key(c, name="cli")
    made = [add_rows(store, run["id"], run["id"], m)["checkpoints"] for m in range(5)]
    result = CliRunner().invoke(operator_cli, ["list", "checkpoints", "--run", run["id"], "--limit", "2", "--all", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["id"] for r in json.loads(result.stdout)["data"]] == made[::-1]
    table = CliRunner().invoke(operator_cli, ["list", "checkpoints", "--run", run["id"], "--limit", "2"],
                               env={"COLUMNS": "240"})
    assert table.exit_code == 0 and made[-1] in table.stdout and "more with --cursor" in table.stdout
    unknown = CliRunner().invoke(operator_cli, ["list", "keys-and-secrets"])
    assert unknown.exit_code == 2 and "expected one of" in unknown.output
