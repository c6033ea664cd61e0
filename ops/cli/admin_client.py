"""The operator CLI's HTTP client for the admin API.

:meth:`AdminClient.request` is the one way out; the named helpers below it are the admin
routes the evaluation commands use (benchmarks, scoring, scores), each returning the answer's
JSON (lists unwrapped from ``{"object": "list", "data": [...]}``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from kit.settings import GymSettings
from ops.cli import gyms


class AdminError(Exception):
    def __init__(self, status: int, body: dict[str, Any] | None, text: str):
        err = (body or {}).get("error") or {}
        self.status = status
        self.type = err.get("type", "http_error")
        self.message = err.get("message", text[:300])
        self.request_id = (body or {}).get("request_id")
        super().__init__(f"{self.type}: {self.message}")


def admin_token(settings: GymSettings, url: str | None = None) -> str:
    if settings.admin_token:
        return settings.admin_token
    path = Path(settings.data_dir) / "admin-token"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise SystemExit(f"no admin token at {path}." + gyms.hint(url or settings.url, Path(settings.data_dir))
                         + " A gym started with that data dir writes one there.") from None


class AdminClient:
    def __init__(self, settings: GymSettings, url: str | None = None):
        self.settings = settings
        self.http = httpx.Client(
            base_url=url or settings.url,
            headers={"Authorization": f"Bearer {admin_token(settings, url)}"},
            timeout=60.0,
        )

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise SystemExit(f"cannot reach the gym at {self.http.base_url}: {type(err).__name__}") from None
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = None
            refused = AdminError(response.status_code, body, response.text)
            if response.status_code == 401 and not self.settings.admin_token:
                refused.message += "." + gyms.hint(str(self.http.base_url), Path(self.settings.data_dir))
            raise refused
        return response.json()

    # -- evaluation -----------------------------------------------------------------------

    def list_data(self, method: str, path: str, **kwargs: Any) -> list[dict[str, Any]]:
        body = self.request(method, path, **kwargs)
        return body["data"] if isinstance(body, dict) else body

    def keys(self) -> list[dict[str, Any]]:
        return self.list_data("GET", "/admin/v1/keys")

    def register_benchmark(self, path: str, *, replace: bool = False, seed_file: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"path": path, "replace": replace}
        if seed_file is not None:
            body["seed_file"] = seed_file
        return self.request("POST", "/admin/v1/benchmarks", json=body)

    def benchmarks(self) -> list[dict[str, Any]]:
        return self.list_data("GET", "/admin/v1/benchmarks")

    def score(self, run_id: str, *, attempts: int = 3, benchmarks: list[str] | None = None,
              split: str = "official", submission_id: str | None = None, subset: int | None = None,
              subset_seed: int | None = None, reference: str | None = None,
              decompose: bool = False) -> list[dict[str, Any]]:
        """Score the run's final submission (``submission_id``: the audited one; 409 if it is not
        the final one). The gym ends an open run first. ``subset``/``subset_seed``: a seeded subset
        of each split; ``reference``: a base model scored next to the initial system; ``decompose``:
        the 2×2 of model × harness's mixed cells too (services/evaluation/decompose.py)."""
        body: dict[str, Any] = {"attempts": attempts, "split": split}
        if benchmarks:
            body["benchmarks"] = benchmarks
        optional = {"submission_id": submission_id, "subset": subset, "subset_seed": subset_seed, "reference": reference}
        body.update({k: v for k, v in optional.items() if v is not None})
        if decompose:
            body["decompose"] = True
        return self.list_data("POST", f"/admin/v1/runs/{quote(run_id, safe='')}/score", json=body)

    def latest_submission(self, run_id: str) -> dict[str, Any] | None:
        rows = self.list_data("GET", "/admin/v1/submissions", params={"run_id": run_id, "limit": 1})
        return rows[0] if rows else None

    def scores(self) -> list[dict[str, Any]]:
        return self.list_data("GET", "/admin/v1/scores")

    def evaluation_job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/admin/v1/evaluation/jobs/{quote(job_id, safe='')}")

    def evaluation_results(self, job_id: str) -> list[dict[str, Any]]:
        return self.list_data("GET", f"/admin/v1/evaluation/jobs/{quote(job_id, safe='')}/results")

    # -- records and audits -----------------------------------------------------------------

    def audit(self, run_id: str, *, trajectory: str | None = None, timeout: float = 3600.0) -> dict[str, Any]:
        body = {"trajectory": trajectory} if trajectory is not None else {}
        return self.request("POST", f"/admin/v1/runs/{quote(run_id, safe='')}/audit", json=body, timeout=timeout)

    def audits(self, run_id: str | None = None) -> list[dict[str, Any]]:
        return self.list_data("GET", "/admin/v1/audits", params={"run_id": run_id} if run_id else None)

    def alerts(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The live monitor's alerts, newest first (services/records/monitor.py)."""
        return self.list_data("GET", "/admin/v1/alerts", params={"run_id": run_id} if run_id else None)

    def integrity(self, run_id: str) -> dict[str, Any]:
        """The run's live integrity: contamination at upload, provenance at submission, the newest audit."""
        return self.request("GET", f"/admin/v1/runs/{quote(run_id, safe='')}/integrity")

    def timeline(self, run_id: str) -> dict[str, Any]:
        """Start, time to first training job, research hours, experiments, spend by service over time."""
        return self.request("GET", f"/admin/v1/runs/{quote(run_id, safe='')}/timeline")

    def run_records(self, run_id: str, what: str) -> Any:
        return self.request("GET", f"/admin/v1/runs/{quote(run_id, safe='')}/{what}")

    # -- watching a run (rsigym watch) ----------------------------------------------------------

    def create_key(self, body: dict[str, Any]) -> dict[str, Any]:
        """Mint a run key (a task's :func:`ops.tasks.key_body`); the answer holds the plaintext ``key``."""
        return self.request("POST", "/admin/v1/keys", json=body)

    def set_deadline(self, key_id: str, deadline_s: float) -> dict[str, Any]:
        """Move the run's deadline (``0``: end the run now)."""
        return self.request("POST", f"/admin/v1/keys/{quote(key_id, safe='')}/deadline", json={"deadline_s": deadline_s})

    def start_run(self, key_id: str) -> dict[str, Any]:
        """Report that the run's agent has started (``created`` → ``running``: its clock counts from now)."""
        return self.request("POST", f"/admin/v1/keys/{quote(key_id, safe='')}/start")

    def end_run(self, key_id: str, reason: str, agent_exit: int | None = None) -> dict[str, Any]:
        """End the run now and record why (access/lifecycle.py END_REASONS) and its agent's exit."""
        return self.request("POST", f"/admin/v1/keys/{quote(key_id, safe='')}/end",
                            json={"reason": reason, "agent_exit": agent_exit})

    def key(self, key_id: str) -> dict[str, Any]:
        return self.request("GET", f"/admin/v1/keys/{quote(key_id, safe='')}")

    def ledger(self, key_id: str) -> list[dict[str, Any]]:
        return self.list_data("GET", f"/admin/v1/keys/{quote(key_id, safe='')}/ledger")

    def trajectory(self, run_id: str) -> list[dict[str, Any]]:
        """The research agent's turns on the agent route, oldest first."""
        return self.list_data("GET", f"/admin/v1/runs/{quote(run_id, safe='')}/trajectory")

    def run_jobs(self, run_id: str) -> list[dict[str, Any]]:
        """The run's queued and running training and evaluation jobs."""
        return self.list_data("GET", f"/admin/v1/runs/{quote(run_id, safe='')}/jobs")

    def run_events(self, run_id: str, *, kind: str | None = None, max_pages: int = 20) -> list[dict[str, Any]]:
        """The run's platform events (of one ``kind``), following the pages, oldest first."""
        events: list[dict[str, Any]] = []
        after = 0
        for _ in range(max_pages):
            params: dict[str, Any] = {"after": after, **({"kind": kind} if kind else {})}
            page = self.request("GET", f"/admin/v1/runs/{quote(run_id, safe='')}/events", params=params)
            events.extend(page["data"])
            if not page.get("has_more"):
                break
            after = page["next_after"]
        return events
