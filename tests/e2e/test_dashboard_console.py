"""The dashboard as an operator's console (issue 55, item 3), in headless Chromium.

One gym and one browser for the module. The runs page lists runs only — the gym's operator key
and a run's agent-model meter are shown apart — with task, agent, state, time left, both meters'
spend, the latest score and the audit; the jobs page shows each in-flight job's worker and
heartbeat, failed jobs and a resumed job; every page fits an 800 px window; and the operator tops
up, pauses, resumes, stops and revokes runs in the browser, each checked against what the gateway
then does with the run's key. Forms without the session's CSRF token, and bad top-up amounts,
are refused and change nothing.

Spend goes through the real ledger (a metered completion for the run, a reserve and settle on the
meter); job, score and audit rows are written through the services' own tables, as in
tests/e2e/test_dashboard.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from billing.ledger import Ledger
from billing.money import nusd_to_usd
from kit.config import GymConfig
from kit.ids import new_id
from kit.settings import GymSettings, ProviderSecrets, StoreSettings
from ops.builder import Gym, build_embedded
from ops.dashboard.app import format_usd
from ops.dashboard.session import COOKIE
from services.evaluation.tables import EvaluationJob, ScoreRow, SubmissionRow
from services.records.tables import AuditRow
from services.training.tables import TrainingJob
from storage.store import Store, sqlite_url
from storage.tables import utcnow
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, TEACHER_ENV, admin_headers, bearer, create_key, gym_config
from tests.e2e.test_dashboard import CHROMIUM, SCREENSHOTS, _chat, _need
from tests.fakes.servers import serve_gym

PAGES = ("/", "/jobs", "/scores", "/leaderboard")
SCORE = 0.625
WORKER = "gpu-node-7:4242:9f3a61"


@dataclass
class Console:
    url: str
    gym: Gym
    run: dict[str, Any]
    meter_id: str
    operator_id: str
    target: dict[str, Any]
    victim: dict[str, Any]
    child_id: str
    jobs: dict[str, str]
    meter_spent_usd: float

    @property
    def base(self) -> str:
        return self.url + "/admin/ui"

    def key(self, key_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/admin/v1/keys/{key_id}", headers=admin_headers(), timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def call(self, key: str) -> int:
        """A run key's cheapest call through the gateway: its status."""
        return httpx.get(f"{self.url}/openai/v1/models", headers=bearer(key), timeout=30).status_code


def _seed_rows(store: Store, run_id: str, target_id: str) -> dict[str, str]:
    now = utcnow()
    ids = {"running": new_id("trj"), "resumed": new_id("trj"), "failed_training": new_id("trj"),
           "failed_eval": new_id("evj"), "score_job": new_id("evj"), "submission": new_id("sub")}
    training = dict(base_model="tiny", parent_checkpoint_id=None, dataset_ids=[], config={"steps": 10},
                    config_hash="c" * 64, loss_module_hash=None, total_steps=10, cost_nusd=0)
    evaluation = dict(benchmark="arithmetic", split="official", harness="minimal", attempts=3, sampling={},
                      task_ids=["t1", "t2"], gateway_url="http://gym", trials_total=6)
    with store.transaction() as s:
        s.add(TrainingJob(id=ids["running"], run_id=run_id, key_id=run_id, status="running", step=4, worker=WORKER,
                          heartbeat_at=now - timedelta(seconds=3), claims=1, created_at=now - timedelta(minutes=6),
                          started_at=now - timedelta(minutes=5), **training))
        # taken by a worker that was lost, put back in the queue (jobs/lifecycle.py reap_stale)
        s.add(TrainingJob(id=ids["resumed"], run_id=target_id, key_id=target_id, status="queued", step=2, worker=None,
                          heartbeat_at=None, claims=1, created_at=now - timedelta(minutes=4), **training))
        s.add(TrainingJob(id=ids["failed_training"], run_id=run_id, key_id=run_id, status="failed", step=1, claims=3,
                          error="its worker stopped (no heartbeat); not resumed again", created_at=now - timedelta(minutes=30),
                          finished_at=now - timedelta(minutes=20), **training))
        s.add(EvaluationJob(id=ids["failed_eval"], run_id=run_id, key_id=run_id, purpose="agent", model="tiny",
                            status="failed", trials_done=1, error="sandbox backend unavailable", claims=1,
                            created_at=now - timedelta(minutes=9), finished_at=now - timedelta(minutes=8), **evaluation))
        s.add(SubmissionRow(id=ids["submission"], run_id=run_id, key_id=run_id, track="joint", checkpoint_id=None,
                            model="tiny", harness="minimal", created_at=now - timedelta(minutes=15)))
        s.add(EvaluationJob(id=ids["score_job"], run_id=run_id, key_id="operator", purpose="score", model="tiny",
                            status="succeeded", trials_done=6, score=SCORE, created_at=now - timedelta(minutes=14),
                            **evaluation))
        s.flush()
        s.add(ScoreRow(id=new_id("scr"), run_id=run_id, submission_id=ids["submission"], benchmark="arithmetic",
                       split="official", model="tiny", harness="minimal", attempts=3, job_id=ids["score_job"],
                       score=SCORE, status="succeeded", agent="dash-agent", created_at=now - timedelta(minutes=14)))
        s.add(AuditRow(id=new_id("aud"), run_id=run_id, status="flagged", hacking_rate=0.5,
                       report={"submission": {"id": ids["submission"]}}, created_at=now - timedelta(minutes=10)))
    return ids


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory, standin: tuple[str, Any], teacher_secret: str) -> Iterator[Console]:
    """One embedded gym for the module, served on loopback, with its runs and rows seeded."""
    data_dir = tmp_path_factory.mktemp("console")
    settings = GymSettings(data_dir=data_dir, admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR)
    store = Store(sqlite_url(settings.data_dir), StoreSettings())
    store.migrate()
    config: GymConfig = gym_config(standin[0])
    gym = build_embedded(settings, config=config, store=store, run_reaper=False,
                         provider_secrets=ProviderSecrets({TEACHER_ENV: teacher_secret}))
    try:
        with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
            run = create_key(client, budget_usd=5.0, name="console-run", agent_budget_usd=2.0, deadline_s=7200,
                             run={"task": "arithmetic-sums", "agent": "dash-agent", "agent_version": "1.2"})
            started = client.post(f"/admin/v1/keys/{run['id']}/start", headers=admin_headers())
            assert started.status_code == 200, started.text
            _chat(client, run["key"], "What is 17 + 25?")
            operator = client.post("/admin/v1/keys", headers=admin_headers(), json={
                "policy": {"services": {"inference": {"models": "*"}}}, "budget_usd": 1_000_000.0,
                "name": "rsigym-operator"})
            assert operator.status_code == 201, operator.text
            target = create_key(client, budget_usd=1.0, name="target-run", deadline_s=3600)
            victim = create_key(client, budget_usd=1.0, name="victim-run")
            child = client.post("/v1/keys", headers=bearer(run["key"]), json={"budget_usd": 0.5, "name": "worker-role"})
            assert child.status_code == 201, child.text
            ledger = Ledger(gym.gateway.store)
            held = ledger.reserve(run["agent_meter_id"], service="agent", operation="messages", estimate_nusd=50_000)
            ledger.settle(held.id, 31_250)
            jobs = _seed_rows(gym.gateway.store, run["id"], target["id"])
            yield Console(url=url, gym=gym, run=run, meter_id=run["agent_meter_id"], operator_id=operator.json()["id"],
                          target=target, victim=victim, child_id=child.json()["id"], jobs=jobs,
                          meter_spent_usd=nusd_to_usd(31_250))
    finally:
        for service_app in gym.service_apps.values():
            close = getattr(service_app.state, "close", None)
            if close is not None:
                close()
        store.dispose()


@dataclass
class Browser:
    page: Any
    context: Any
    csrf: str
    cookie: str


@pytest.fixture(scope="module")
def browser(console: Console) -> Iterator[Browser]:
    """Headless Chromium, logged in to the dashboard, for the whole module."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("the playwright package")
    if not Path(CHROMIUM).exists():
        _need(f"Debian's chromium at {CHROMIUM}")
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            context = chromium.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.on("dialog", lambda d: pytest.fail(f"unexpected dialog: {d.message}"))
            page.goto(console.base + "/")
            page.fill("#token", ADMIN_TOKEN)
            page.click("button[type=submit]")
            page.wait_for_url(console.base + "/")
            csrf = page.locator("meta[name=csrf-token]").get_attribute("content")
            (cookie,) = [c["value"] for c in context.cookies() if c["name"] == COOKIE]
            yield Browser(page=page, context=context, csrf=csrf or "", cookie=cookie)
            context.close()
        finally:
            chromium.close()


def _cells(page: Any, selector: str) -> dict[str, str]:
    """A row's cells by their data-col name."""
    row = page.locator(selector)
    return {cell.get_attribute("data-col"): cell.inner_text().strip()
            for cell in row.locator("td[data-col]").all()}


def test_runs_page_lists_runs_only_with_their_facts(console: Console, browser: Browser) -> None:
    page, c = browser.page, console
    page.goto(c.base + "/")
    listed = page.locator("table.runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)")
    assert sorted(listed) == sorted([c.run["id"], c.target["id"], c.victim["id"]])  # no operator key, meter, child
    assert page.locator("#total-runs").inner_text() == "3"
    assert page.locator("#total-budget").inner_text() == "$7.00"
    assert page.locator("#total-agent-spent").inner_text() == format_usd(c.meter_spent_usd)
    spent = c.key(c.run["id"])["spent_usd"]
    cells = _cells(page, f"tr[data-run='{c.run['id']}']")
    assert cells["task"].splitlines()[0] == "arithmetic-sums"
    assert cells["agent"] == "dash-agent 1.2"
    assert cells["state"] == "running"  # scored, but a run's state moves past ended only once it ended
    assert cells["services"].splitlines() == [format_usd(spent), "of $5.00"]
    assert cells["agent-model"].splitlines() == [format_usd(c.meter_spent_usd), "of $2.00"]
    assert cells["score"].splitlines() == [f"{SCORE:.4f}", "arithmetic"]
    assert cells["audit"] == "flagged"
    assert cells["time-left"].endswith("m") and cells["time-left"].startswith(("2h", "119m", "118m"))
    victim = _cells(page, f"tr[data-run='{c.victim['id']}']")
    assert (victim["state"], victim["time-left"], victim["agent-model"], victim["score"], victim["audit"]) == (
        "running", "—", "no meter", "—", "not audited")
    platform = page.locator("table.platform tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
    assert sorted(platform) == sorted([c.operator_id, c.meter_id])
    meter_row = page.locator(f"table.platform tr[data-key='{c.meter_id}']").inner_text()
    assert "agent-model meter of" in meter_row and c.run["id"] in meter_row
    assert "operator" in page.locator(f"table.platform tr[data-key='{c.operator_id}']").inner_text()
    page.screenshot(path=str(_shot_path("console-runs")), full_page=True)


def _shot_path(name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / f"{name}.png"


def test_jobs_page_shows_workers_heartbeats_failures_and_resumes(console: Console, browser: Browser) -> None:
    page, c = browser.page, console
    page.goto(c.base + "/jobs")
    running = page.locator(f"table.training tr[data-job='{c.jobs['running']}'] td.worker").inner_text()
    assert WORKER in running and "heartbeat" in running and "ago" in running and "stale" not in running
    resumed = page.locator(f"table.training tr[data-job='{c.jobs['resumed']}']").inner_text()
    assert "queued" in resumed and "resumed ×1" in resumed and "waiting for a worker" in resumed
    assert int(page.locator("#resumed-count").inner_text()) >= 2  # the re-queued one and the failed one taken 3 times
    failed = page.locator("table.failed tbody tr").evaluate_all("rows => rows.map(r => r.dataset.job)")
    assert failed == [c.jobs["failed_eval"], c.jobs["failed_training"]]  # newest first
    assert "sandbox backend unavailable" in page.locator(f"table.failed tr[data-job='{c.jobs['failed_eval']}']").inner_text()
    page.screenshot(path=str(_shot_path("console-jobs")), full_page=True)


def test_every_page_fits_800px(console: Console, browser: Browser) -> None:
    c = browser.context.new_page()
    try:
        c.set_viewport_size({"width": 800, "height": 900})
        for path in (*PAGES, f"/runs/{console.run['id']}", f"/runs/{console.target['id']}",
                     f"/evaluation/{console.jobs['failed_eval']}"):
            c.goto(console.base + path)
            assert c.url == console.base + path
            width = c.evaluate("document.documentElement.scrollWidth")
            assert width <= 800, f"{path} is {width} px wide"
        c.goto(console.base + "/")
        # the runs and platform tables fit outright: nothing scrolls, even inside its box
        assert c.evaluate("[...document.querySelectorAll('.table-wrap')].every(w => w.scrollWidth <= w.clientWidth)")
        c.screenshot(path=str(_shot_path("console-runs-800")), full_page=True)
    finally:
        c.close()


def _act(page: Any, c: Console, run_id: str, button: str, *, amount: str | None = None) -> Any:
    page.goto(f"{c.base}/runs/{run_id}")
    if amount is not None:
        page.fill("#amount_usd", amount)
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.click(f"#action-{button}")
    page.wait_for_load_state()
    return answer.value


def test_operator_actions_in_the_browser(console: Console, browser: Browser) -> None:
    page, c = browser.page, console
    run_id, key = c.target["id"], c.target["key"]
    assert c.call(key) == 200
    page.goto(f"{c.base}/runs/{run_id}")
    shown = {b.get_attribute("id") for b in page.locator(".actions button").all()}
    assert shown == {"action-topup", "action-pause", "action-stop", "action-revoke"}  # no resume while running

    # top up: the budget rises by exactly that
    before = c.key(run_id)["budget_usd"]
    answer = _act(page, c, run_id, "topup", amount="2.25")
    assert answer.status == 303 and page.url == f"{c.base}/runs/{run_id}?done=topup"
    assert page.locator("#action-done").inner_text() == "Topped up."
    assert c.key(run_id)["budget_usd"] == pytest.approx(before + 2.25, abs=1e-9)
    assert page.locator("#run-budget").inner_text() == format_usd(before + 2.25)

    # top up the agent-model meter of a run that has one: the meter's budget rises, the run's does not
    run_before, meter_before = c.key(c.run["id"])["budget_usd"], c.key(c.meter_id)["budget_usd"]
    page.goto(f"{c.base}/runs/{c.run['id']}")
    page.fill("#amount_usd", "1.5")
    page.select_option("select[name=account]", "agent")
    page.click("#action-topup")
    page.wait_for_url(f"{c.base}/runs/{c.run['id']}?done=topup")
    assert c.key(c.meter_id)["budget_usd"] == pytest.approx(meter_before + 1.5, abs=1e-9)
    assert c.key(c.run["id"])["budget_usd"] == run_before

    # pause: the key is refused at once (the gateway's paused answer), the run shows paused
    _act(page, c, run_id, "pause")
    assert page.locator("#run-state").inner_text() == "paused"
    assert c.call(key) == 403
    assert c.key(run_id)["state"] == "paused"
    shown = {b.get_attribute("id") for b in page.locator(".actions button").all()}
    assert "action-resume" in shown and "action-pause" not in shown

    # resume: the key works again
    _act(page, c, run_id, "resume")
    assert page.locator("#run-state").inner_text() == "running"
    assert c.call(key) == 200

    # stop: the run ends (stopped), the key is refused, nothing more to do
    _act(page, c, run_id, "stop")
    assert page.locator("#run-state").inner_text() == "ended (stopped)"
    assert c.call(key) == 403
    assert c.key(run_id)["state"] == "ended (stopped)"
    assert page.locator(".actions button").count() == 0 and page.locator("#no-actions").is_visible()
    page.screenshot(path=str(_shot_path("console-run-stopped")), full_page=True)

    # revoke (another run): final
    _act(page, c, c.victim["id"], "revoke")
    assert page.locator("#run-state").inner_text() == "ended (revoked)"
    assert c.call(c.victim["key"]) == 401
    assert c.key(c.victim["id"])["status"] == "revoked"

    # an ended run takes no action, whatever is posted
    r = page.request.post(f"{c.base}/runs/{run_id}/resume", form={"csrf_token": browser.csrf},
                          headers={"Accept": "text/html"}, max_redirects=0)
    assert r.status == 409 and c.key(run_id)["state"] == "ended (stopped)"


def test_actions_refuse_a_missing_or_wrong_csrf_token(console: Console, browser: Browser) -> None:
    c = console
    run_id = c.run["id"]
    before = c.key(run_id)
    cookie = {"Cookie": f"{COOKIE}={browser.cookie}"}
    with httpx.Client(timeout=30, follow_redirects=False) as http:
        for form in ({}, {"csrf_token": "forged-" + browser.csrf[:8]}, {"csrf_token": ""}):
            for action, extra in (("topup", {"amount_usd": "3"}), ("pause", {}), ("stop", {}), ("revoke", {})):
                r = http.post(f"{c.base}/runs/{run_id}/{action}", data={**form, **extra}, headers=cookie)
                assert r.status_code == 403, (action, form, r.text)
                assert r.json()["error"]["param"] == "csrf_token"
        # the right token in the form, but no session: off to the login form, nothing done
        r = http.post(f"{c.base}/runs/{run_id}/pause", data={"csrf_token": browser.csrf})
        assert (r.status_code, r.headers["location"]) == (303, "/admin/ui/login")
    after = c.key(run_id)
    assert (after["budget_usd"], after["status"], after["state"]) == (before["budget_usd"], before["status"], before["state"])
    assert c.call(c.run["key"]) == 200


def test_only_run_keys_can_be_acted_on(console: Console, browser: Browser) -> None:
    c = console
    with httpx.Client(timeout=30, follow_redirects=False) as http:
        for key_id in (c.operator_id, c.meter_id, c.child_id, "key_unknown"):
            r = http.post(f"{c.base}/runs/{key_id}/pause", data={"csrf_token": browser.csrf},
                          headers={"Cookie": f"{COOKIE}={browser.cookie}"})
            assert r.status_code == 404, (key_id, r.text)
            assert http.get(f"{c.base}/runs/{key_id}", headers={"Cookie": f"{COOKIE}={browser.cookie}"}).status_code == 404
        r = http.post(f"{c.base}/runs/{c.run['id']}/explode", data={"csrf_token": browser.csrf},
                      headers={"Cookie": f"{COOKIE}={browser.cookie}"})
        assert r.status_code == 422
    assert {c.key(k)["status"] for k in (c.operator_id, c.meter_id, c.child_id)} == {"active"}


@pytest.mark.parametrize(("amount", "message"), [
    ("0", "the top-up amount must be more than $0"),
    ("-5", "the top-up amount must be more than $0"),
    ("ten dollars", "the top-up amount must be a number of USD, e.g. 5 or 2.50"),
    ("nan", "the top-up amount must be more than $0"),
    ("2000000", "the top-up amount may be at most $1,000,000"),
])
def test_bad_topup_amounts_are_refused_clearly(console: Console, browser: Browser, amount: str, message: str) -> None:
    page, c = browser.page, console
    run_id = c.run["id"]
    before = c.key(run_id)["budget_usd"]
    answer = _act(page, c, run_id, "topup", amount=amount)
    assert answer.status == 422
    assert page.locator("#error-message").inner_text() == message
    assert page.get_by_role("link", name="Back to the run", exact=True).get_attribute("href") == f"/admin/ui/runs/{run_id}"
    assert c.key(run_id)["budget_usd"] == before
