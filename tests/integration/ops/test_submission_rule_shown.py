"""Which submission counts is said once (services/evaluation/submission_rule.py) and shown the same
by ``rsigym run show`` and the dashboard's run page."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from ops.cli import runs
from ops.cli.main import app
from ops.dashboard.session import LOGIN_COOKIE
from ops.launcher import RunRecord, runs_root
from services.evaluation.submission_rule import SUBMISSION_RULE
from tests.conftest import ADMIN_TOKEN, create_key
from tests.fakes.servers import serve_gym


def test_run_show_and_the_dashboard_show_the_same_rule(gym: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert "latest submission before the run ends" in SUBMISSION_RULE  # what final_submission() does
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=30) as client:
        run = create_key(client, budget_usd=1.0)
        form = client.get("/admin/ui/login")
        csrf = form.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        client.cookies.set(LOGIN_COOKIE, form.cookies[LOGIN_COOKIE])
        assert client.post("/admin/ui/login", data={"token": ADMIN_TOKEN, "csrf_token": csrf}).status_code == 303
        page = client.get(f"/admin/ui/runs/{run['id']}")
    assert page.status_code == 200
    shown = " ".join(html.unescape(page.text).split())
    assert SUBMISSION_RULE in shown and "Final submission: none yet" in shown

    record = RunRecord(run="r1", key_id=run["id"], task="t", agent="a", pid=1, started_at="2025-01-01T00:00:00Z",
                       deadline_s=60.0)
    (runs_root(tmp_path) / "r1").mkdir(parents=True)
    (runs_root(tmp_path) / "r1" / "run.json").write_text(record.model_dump_json())
    monkeypatch.setattr(runs, "with_gym_states", lambda records, *a: records)  # no gym to ask here
    out = CliRunner().invoke(app, ["run", "show", "r1", "--data-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert f"submission rule: {SUBMISSION_RULE}" in " ".join(out.output.split())
