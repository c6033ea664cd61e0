"""The live dashboard (/admin/ui) in headless Chromium: an operator logs in with the admin
token, visits every page and sees a seeded run's figures; logins are required and never taken
from a URL; an agent-written trajectory with a script in it stays text; a screenshot of every
page is saved (RSIGYM_SCREENSHOT_DIR, default build/screenshots/).

The run is seeded through the real APIs where that is cheap (its key through the admin API,
metered completions through the rollout stand-in, so the ledger and spend are real). Training
and evaluation rows are written through the services' own tables: running a training job and
a scored evaluation would take minutes here, and the dashboard only reads those rows.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit.errors import NotFound
from kit.ids import new_id
from ops.dashboard.app import format_usd
from ops.dashboard.session import COOKIE, LOGIN_COOKIE, id_hash, session_key
from services.evaluation import read as evaluation_read
from services.evaluation.tables import EvaluationJob, ScoreRow, SubmissionRow, TrialResultRow
from services.training.checkpoints import Checkpoint
from services.training.tables import Dataset, TrainingJob
from storage.store import Store
from storage.tables import utcnow
from tests.conftest import ADMIN_TOKEN, IN_CI, admin_headers, bearer, create_key
from tests.fakes.servers import serve_gym

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("RSIGYM_SCREENSHOT_DIR") or REPO / "build" / "screenshots")
CHROMIUM = os.environ.get("RSIGYM_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
XSS_TEXT = "<script>window.__pwned = 1; alert('xss')</script>"
XSS_IMG = "<img src=x onerror=window.__pwned=2>"
STEP_TEXT = "I will compute 17 + 25 with the calculator tool."
OBSERVATION = "calculator returned 42"
INITIAL, SUBMITTED = 0.2, 0.68
RSI = (SUBMITTED - INITIAL) / (1 - INITIAL)


def _need(what: str) -> None:
    if IN_CI:
        pytest.fail(f"the dashboard test needs {what} in CI")
    pytest.skip(f"needs {what} (set CI=true to make this a failure)")


@pytest.fixture(scope="module")
def sync_playwright() -> Any:
    try:
        from playwright.sync_api import sync_playwright as factory
    except ImportError:
        _need("the playwright package")
    if not Path(CHROMIUM).exists():
        _need(f"Debian's chromium at {CHROMIUM}")
    return factory


@dataclass
class Seeded:
    url: str
    run: dict[str, Any]
    other: dict[str, Any]
    spent_usd: float
    ledger_rows: int
    checkpoint: str
    running_job: str
    queued_eval: str
    score_job: str
    trial_id: int


def _chat(client: httpx.Client, key: str, text: str) -> None:
    r = client.post("/rollout/v1/chat/completions", headers=bearer(key),
                    json={"model": "teacher", "messages": [{"role": "user", "content": text}], "max_tokens": 8})
    assert r.status_code == 200, r.text


def _seed_platform_rows(store: Store, run_id: str, key_id: str) -> dict[str, Any]:
    """Training and evaluation rows as the services leave them (see the module docstring)."""
    now = utcnow()
    ds, done_job, running_job, ckpt = new_id("ds"), new_id("trj"), new_id("trj"), new_id("ckpt")
    base_job, score_job, queued_eval, sub = new_id("evj"), new_id("evj"), new_id("evj"), new_id("sub")
    trajectory = {
        "schema_version": "ATIF-v1.6", "session_id": "s1",
        "agent": {"name": "minimal", "version": "1", "model_name": ckpt},
        "steps": [
            {"step_id": 1, "source": "user", "message": "What is 17 + 25? " + XSS_TEXT},
            {"step_id": 2, "source": "agent", "message": STEP_TEXT,
             "tool_calls": [{"tool_call_id": "call_1", "function_name": "calculator",
                             "arguments": {"expression": "17 + 25", "note": XSS_IMG}}],
             "observation": {"results": [{"source_call_id": "call_1", "content": OBSERVATION}]}},
            {"step_id": 3, "source": "agent", "message": "42"},
        ],
        "final_metrics": {"total_steps": 3},
        "extra": {"stop_reason": "finish", "answer": "42"},
    }
    job_common = dict(benchmark="arithmetic", split="official", harness="minimal", attempts=3, sampling={},
                      task_ids=["t1", "t2"], gateway_url="http://gym", trials_total=6)
    with store.transaction() as s:
        s.add(Dataset(id=ds, run_id=run_id, key_id=key_id, name="sums-v1", sha256="a" * 64, format="chat", rows=1200,
                      bytes=48_000, created_at=now - timedelta(minutes=30)))
        s.flush()
        s.add(TrainingJob(id=done_job, run_id=run_id, key_id=key_id, status="succeeded", base_model="tiny",
                          parent_checkpoint_id=None, dataset_ids=[ds], config={"steps": 10}, config_hash="c" * 64,
                          loss_module_hash=None, total_steps=10, step=10, cost_nusd=0,
                          created_at=now - timedelta(minutes=25), finished_at=now - timedelta(minutes=20)))
        s.add(TrainingJob(id=running_job, run_id=run_id, key_id=key_id, status="running", base_model="tiny",
                          parent_checkpoint_id=ckpt, dataset_ids=[ds], config={"steps": 10}, config_hash="d" * 64,
                          loss_module_hash=None, total_steps=10, step=3, cost_nusd=0,
                          created_at=now - timedelta(minutes=5), started_at=now - timedelta(minutes=4)))
        s.flush()
        s.add(Checkpoint(id=ckpt, run_id=run_id, job_id=done_job, base_model="tiny", parent_checkpoint_id=None,
                         dataset_hashes=["a" * 64], config_hash="c" * 64, loss_module_hash=None, step=10,
                         metrics={"loss": 0.5}, weights_hash="e" * 64, path="/nonexistent",
                         created_at=now - timedelta(minutes=20)))
        s.add(SubmissionRow(id=sub, run_id=run_id, key_id=key_id, track="joint", checkpoint_id=ckpt, model=ckpt,
                            harness="minimal", created_at=now - timedelta(minutes=15)))
        s.add(EvaluationJob(id=base_job, run_id="operator", key_id="operator", purpose="baseline", model="tiny",
                            status="succeeded", trials_done=6, score=INITIAL, created_at=now - timedelta(minutes=14),
                            **job_common))
        s.add(EvaluationJob(id=score_job, run_id=run_id, key_id="operator", purpose="score", model=ckpt,
                            status="succeeded", trials_done=6, score=SUBMITTED, created_at=now - timedelta(minutes=14),
                            **job_common))
        s.add(EvaluationJob(id=queued_eval, run_id=run_id, key_id=key_id, purpose="agent", model=ckpt,
                            status="queued", trials_done=0, created_at=now - timedelta(minutes=2), **job_common))
        s.add(ScoreRow(id=new_id("scr"), run_id="initial", submission_id=None, benchmark="arithmetic",
                       split="official", model="tiny", harness="minimal", attempts=3, job_id=base_job, score=INITIAL,
                       status="succeeded", agent=None, created_at=now - timedelta(minutes=14)))
        s.add(ScoreRow(id=new_id("scr"), run_id=run_id, submission_id=sub, benchmark="arithmetic", split="official",
                       model=ckpt, harness="minimal", attempts=3, job_id=score_job, score=SUBMITTED,
                       status="succeeded", agent="dash-agent", created_at=now - timedelta(minutes=14)))
        trial = TrialResultRow(job_id=score_job, task_id="t1", attempt=1, reward=1.0, error=None,
                               trajectory=trajectory, verifier_output="checking answer.txt\nreward: 1.0\n" + XSS_TEXT,
                               agent_output="", sandbox_id=None, started_at=None, finished_at=now.isoformat())
        s.add(trial)
        s.flush()
        trial_id = trial.id
    return {"checkpoint": ckpt, "running_job": running_job, "queued_eval": queued_eval, "score_job": score_job,
            "trial_id": trial_id}


@pytest.fixture
def seeded(gym: Any) -> Iterator[Seeded]:
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        run = create_key(client, budget_usd=5.0, name="dash-agent")
        other = create_key(client, budget_usd=2.5, track="data", name="other-run")
        for text in ("What is 17 + 25?", "Say something.", "And once more."):
            _chat(client, run["key"], text)
        shown = client.get(f"/admin/v1/keys/{run['id']}", headers=admin_headers()).json()
        ledger = client.get(f"/admin/v1/keys/{run['id']}/ledger", headers=admin_headers()).json()["data"]
        assert shown["spent_usd"] > 0 and len(ledger) == 3
        rows = _seed_platform_rows(gym.gateway.store, run["id"], run["id"])
        yield Seeded(url=url, run=run, other=other, spent_usd=shown["spent_usd"], ledger_rows=len(ledger), **rows)


def _shot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_dashboard_pages_in_headless_chromium(seeded: Seeded, sync_playwright: Any) -> None:
    s, base = seeded, seeded.url + "/admin/ui"
    run_id = s.run["id"]
    dialogs: list[str] = []
    shots: list[Path] = []
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            # -- no session: every page sends the browser to the login form --------------------
            anon = browser.new_context()
            page = anon.new_page()
            for path in ("/", f"/runs/{run_id}", "/jobs", "/scores", "/leaderboard", f"/evaluation/{s.score_job}",
                         f"/evaluation/{s.score_job}/trials/{s.trial_id}"):
                page.goto(base + path)
                assert page.url == base + "/login", path
            # the admin token in a URL opens nothing
            page.goto(f"{base}/?token={ADMIN_TOKEN}")
            assert page.url == base + "/login"
            page.goto(f"{base}/login?token={ADMIN_TOKEN}")
            assert page.url == base + "/login" and [c["name"] for c in anon.cookies()] == [LOGIN_COOKIE]
            shots.append(_shot(page, "01-login"))
            # a wrong token: 401, the form again, the token not echoed back
            page.fill("#token", "rsa-guessed-token-XYZ")
            with page.expect_response(lambda r: r.url == base + "/login" and r.request.method == "POST") as answer:
                page.click("button[type=submit]")
            assert answer.value.status == 401
            assert page.get_by_role("alert").inner_text() == "That is not this gym's admin token."
            assert "rsa-guessed-token-XYZ" not in page.content()
            assert COOKIE not in [c["name"] for c in anon.cookies()]
            anon.close()

            # -- log in ---------------------------------------------------------------------
            ctx = browser.new_context(viewport={"width": 1360, "height": 900})
            page = ctx.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(base + "/")
            page.fill("#token", ADMIN_TOKEN)
            page.click("button[type=submit]")
            page.wait_for_url(base + "/")
            (cookie,) = ctx.cookies()  # the login form's own cookie is gone
            assert (cookie["name"], cookie["path"], cookie["httpOnly"], cookie["sameSite"]) == (
                COOKIE, "/admin/ui", True, "Strict")
            assert ADMIN_TOKEN not in cookie["value"]
            assert 11 * 3600 < cookie["expires"] - time.time() <= 12 * 3600
            csrf = page.locator("meta[name=csrf-token]").get_attribute("content")
            assert csrf and page.locator("form.logout input[name=csrf_token]").get_attribute("value") == csrf

            # -- overview: the run's budget and spend, and the totals --------------------------
            row = page.locator(f"tr[data-run='{run_id}']")
            cells = {td.get_attribute("data-col"): td.inner_text() for td in row.locator("td[data-col]").all()}
            assert row.locator("td").first.inner_text().splitlines() == [run_id, "dash-agent"]
            assert (cells["task"].splitlines(), cells["state"], cells["time-left"]) == (["—", "joint"], "running", "—")
            assert cells["services"].splitlines() == [format_usd(s.spent_usd), "of $5.00"]
            assert (cells["agent-model"], cells["audit"]) == ("no meter", "not audited")
            assert cells["score"].splitlines() == [f"{SUBMITTED:.4f}", "arithmetic"]
            assert page.locator("#total-runs").inner_text() == "2"
            assert page.locator("#total-budget").inner_text() == "$7.50"
            assert page.locator("#total-spent").inner_text() == format_usd(s.spent_usd)
            shots.append(_shot(page, "02-overview"))

            # -- run detail: figures, spend chart, ledger, experiment graph, score --------------
            row.locator("a").first.click()
            page.wait_for_url(f"{base}/runs/{run_id}")
            assert page.locator("#run-id").inner_text() == run_id
            assert page.locator("#run-budget").inner_text() == "$5.00"
            assert page.locator("#run-spent").inner_text() == format_usd(s.spent_usd)
            assert page.locator("#spend-chart circle.dot").count() == s.ledger_rows
            assert page.locator("table.ledger tbody tr").count() == s.ledger_rows
            graph = page.locator("#experiment-graph")
            for node in ("sums-v1", s.checkpoint[:21], "arithmetic/official", f"arithmetic: {SUBMITTED:.4f}"):
                assert graph.get_by_text(node).count() >= 1, node
            assert graph.locator("path.edge").count() >= 6
            assert page.locator("table.scores").get_by_text(f"{SUBMITTED:.4f}").count() == 1
            shots.append(_shot(page, "03-run"))

            # -- jobs and queues ------------------------------------------------------------
            page.click("nav >> text=Jobs & queues")
            page.wait_for_url(base + "/jobs")
            running = page.locator("tr", has=page.get_by_text(s.running_job, exact=True))
            assert "3/10" in running.inner_text() and "running" in running.inner_text()
            evaluation_queue = page.locator("tr[data-queue='evaluation'] td").all_inner_texts()
            assert evaluation_queue[:3] == ["evaluation", "1", "0"]
            training_queue = page.locator("tr[data-queue='training'] td").all_inner_texts()
            assert training_queue[:3] == ["training", "0", "1"]
            assert page.get_by_text(s.queued_eval).count() == 1
            shots.append(_shot(page, "04-jobs"))

            # -- submissions and scores -------------------------------------------------------
            page.click("nav >> text=Submissions & scores")
            page.wait_for_url(base + "/scores")
            scored = page.locator("table.scores tr", has=page.get_by_text(run_id, exact=True)).all_inner_texts()
            assert len(scored) == 1 and f"{SUBMITTED:.4f}" in scored[0] and "not audited" in scored[0]
            assert page.locator("table.scores").get_by_text(f"{INITIAL:.4f}").count() == 1
            shots.append(_shot(page, "05-scores"))

            # -- RSI-Index leaderboard -------------------------------------------------------
            page.click("nav >> text=RSI-Index")
            page.wait_for_url(base + "/leaderboard")
            ranked = page.locator(f"table.leaderboard tr[data-run='{run_id}'] td").all_inner_texts()
            assert ranked[:6] == ["1", run_id, "dash-agent", "joint", "1 of 1", f"{RSI:.4f}"]  # then its 95% CI
            shots.append(_shot(page, "06-leaderboard"))

            # -- evaluation job → trials → trajectory (agent-written: must stay text) -----------
            page.goto(f"{base}/evaluation/{s.score_job}")
            assert page.locator("table.trials tbody tr").count() == 1
            shots.append(_shot(page, "07-evaluation"))
            page.click("text=trajectory")
            page.wait_for_url(f"{base}/evaluation/{s.score_job}/trials/{s.trial_id}")
            assert page.locator("#trial-reward").inner_text() == "1.0000"
            assert page.locator("li.step").count() == 3
            assert page.get_by_text(STEP_TEXT).is_visible()
            assert page.get_by_text(OBSERVATION).is_visible()
            assert page.locator(".call code", has_text="calculator").count() == 1
            assert page.locator("pre.message", has_text=XSS_TEXT).count() == 1  # shown as text…
            assert page.locator(".call pre", has_text=XSS_IMG).count() == 1
            assert page.locator("pre.verifier", has_text=XSS_TEXT).count() == 1
            assert page.locator("main script, main img").count() == 0  # …never as elements
            assert page.evaluate("window.__pwned") is None and dialogs == []
            shots.append(_shot(page, "08-trajectory"))

            # -- log out: the session is gone, also for a copy of its cookie -------------------
            copy = browser.new_context()
            copy.add_cookies([{k: cookie[k] for k in ("name", "value", "domain", "path", "httpOnly", "sameSite")}])
            copied = copy.new_page()
            copied.goto(base + "/jobs")
            assert copied.url == base + "/jobs"  # a copied cookie works while the session lives ...
            page.click("header >> text=Log out")
            page.wait_for_url(base + "/login")
            page.goto(base + "/")
            assert page.url == base + "/login"
            copied.goto(base + "/jobs")
            assert copied.url == base + "/login"  # ... and is refused once it was logged out
            copy.close()
            ctx.close()
        finally:
            browser.close()
    assert dialogs == []
    for path in shots:
        assert path.stat().st_size > 5 * 1024, path
    assert [p.name for p in shots] == [f"{n}.png" for n in (
        "01-login", "02-overview", "03-run", "04-jobs", "05-scores", "06-leaderboard", "07-evaluation", "08-trajectory")]


def _login_csrf(http: httpx.Client, base: str) -> tuple[str, str]:
    """(the login form's cookie, its CSRF token), as a browser gets them with the form."""
    form = http.get(f"{base}/login")
    token = form.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    return form.cookies[LOGIN_COOKIE], token


def test_session_cookie_opens_the_ui_only_and_cannot_be_forged(seeded: Seeded, gym: Any) -> None:
    """Outside the browser: what a stolen, forged or expired cookie, or a token in the URL, gets."""
    base = seeded.url + "/admin/ui"
    key = session_key(ADMIN_TOKEN, gym.gateway.internal_secret)
    with httpx.Client(timeout=30) as http:
        nonce, csrf = _login_csrf(http, base)
        # the token as a query parameter of the login POST (the form's fields but no token): refused, no cookie
        r = http.post(f"{base}/login?token={ADMIN_TOKEN}", data={"csrf_token": csrf})
        assert r.status_code == 401 and COOKIE not in r.cookies
        r = http.post(f"{base}/login", data={"token": ADMIN_TOKEN, "csrf_token": csrf}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/admin/ui/"
        good = r.cookies[COOKIE]
        http.cookies.clear()  # from here on, each request carries exactly what it says
        page = http.get(f"{base}/runs/{seeded.run['id']}", headers={"Cookie": f"{COOKIE}={good}"})
        assert page.status_code == 200 and seeded.run["id"] in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        # the UI session is not an admin credential: the JSON admin API refuses it
        api = http.get(seeded.url + "/admin/v1/keys", headers={"Cookie": f"{COOKIE}={good}"})
        assert api.status_code == 401 and seeded.run["key"] not in api.text
        # made-up, tampered and hashed-instead-of-raw ids, and the login form's nonce, are all sent to the login form
        tampered = good[:-2] + ("AA" if not good.endswith("AA") else "BB")
        for bad in ("made-up-session-id-" + "x" * 24, tampered, id_hash(key, good), nonce, "", "v1.1.2.3"):
            r = http.get(f"{base}/", headers={"Cookie": f"{COOKIE}={bad}"}, follow_redirects=False)
            assert (r.status_code, r.headers.get("location")) == (303, "/admin/ui/login"), bad
        # a run's own key opens nothing here either
        r = http.get(f"{base}/", headers=bearer(seeded.run["key"]), follow_redirects=False)
        assert r.status_code == 303


def test_page_queries_read_the_same_figures_on_sqlite_and_postgres(store: Store) -> None:
    """The query layer on both stores (the browser test runs on SQLite): keys made by the key
    registry, charges made by the real ledger, the platform rows as above."""
    from access.keys import KeyRegistry
    from access.presets import preset_policy
    from billing.ledger import Ledger
    from billing.money import usd_to_nusd
    from kit.config import GymConfig
    from ops.dashboard import queries

    keys, ledger = KeyRegistry(store), Ledger(store)
    run, _ = keys.create(policy=preset_policy("joint", GymConfig()), budget_nusd=usd_to_nusd(5), track="joint", name="dash-agent")
    child, _ = keys.create(policy=preset_policy("joint", GymConfig()), budget_nusd=usd_to_nusd(1), parent_id=run["id"])
    charges = [1_500, 2_250, 40_000]  # nano-USD; the last one on the child key
    for key_id, nusd in zip((run["id"], run["id"], child["id"]), charges, strict=True):
        held = ledger.reserve(key_id, service="rollout", operation="chat.completions", estimate_nusd=nusd * 2)
        ledger.settle(held.id, nusd)
    ledger.reserve(run["id"], service="training", operation="step", estimate_nusd=7_000)  # still held
    seeded = _seed_platform_rows(store, run["id"], run["id"])

    from billing.agent_meter import attach_meter
    operator, _ = keys.create(policy=preset_policy("joint", GymConfig()), budget_nusd=usd_to_nusd(1_000_000), track=None,
                              name=evaluation_read.OPERATOR_KEY_NAME)
    meter = attach_meter(store, run["id"], usd_to_nusd(2))
    overview = queries.overview(store)
    assert [r["id"] for r in overview["runs"]] == [run["id"]]  # the operator key and the meter are not runs
    assert {(k["id"], k["kind"]) for k in overview["platform"]} == {
        (operator["id"], "operator"), (meter["id"], "agent-model meter")}
    (row,) = [r for r in overview["runs"] if r["id"] == run["id"]]
    assert (row["state"], row["meter"]["budget_usd"], row["audit"]) == ("running", 2.0, "not audited")
    assert (row["budget_usd"], row["spent_usd"], row["reserved_usd"]) == (5.0, 4.375e-05, 7e-06)
    assert row["remaining_usd"] == pytest.approx(5 - 4.375e-05 - 7e-06)
    detail = queries.run_detail(store, run["id"], 200)
    assert detail["child_keys"] == 1 and detail["ledger_total"] == 4
    assert [v for _, v in detail["spend"]] == [1.5e-06, 3.75e-06, 4.375e-05]  # cumulative, child included
    graph = detail["graph"]
    assert seeded["checkpoint"] in graph.nodes and "base:tiny" in graph.nodes
    kinds = sorted(graph.nodes[e.dst].kind for e in graph.edges if e.src == seeded["checkpoint"])
    assert kinds == ["evaluation", "evaluation", "submission", "training_job"]
    jobs = queries.jobs(store, 200, heartbeat_ttl_s=30)
    queues = {q["name"]: (q["queued"], q["running"]) for q in jobs["queues"]}
    assert queues["evaluation"] == (1, 0) and queues["training"] == (0, 1)
    assert [j["id"] for j in jobs["training"]] == [seeded["running_job"]]
    scored = [r for r in queries.scores(store, 200)["scores"] if r["run_id"] == run["id"]]
    assert [(r["score"], r["status"], r["audit"]) for r in scored] == [(SUBMITTED, "succeeded", "not audited")]
    board = queries.leaderboard(store, "official")
    assert [(r["run_id"], r["agent"], r["track"]) for r in board["runs"]] == [(run["id"], "dash-agent", "joint")]
    assert board["runs"][0]["index"] == pytest.approx(RSI)
    trial = queries.trial(store, seeded["score_job"], seeded["trial_id"])
    assert [st["source"] for st in trial["steps"]] == ["user", "agent", "agent"]
    assert trial["steps"][1]["calls"][0]["name"] == "calculator"
    assert trial["steps"][1]["results"] == [{"call": "call_1", "content": OBSERVATION}]
    with pytest.raises(NotFound):
        queries.trial(store, new_id("evj"), seeded["trial_id"])  # a trial is only found under its own job
    for not_a_run in (child["id"], operator["id"], meter["id"]):  # a child key, a platform key: not runs
        with pytest.raises(NotFound):
            queries.run_detail(store, not_a_run, 200)
