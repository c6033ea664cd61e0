"""The operator CLI's HTTP client for the admin API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from services.core.settings import GymSettings


class AdminError(Exception):
    def __init__(self, status: int, body: dict[str, Any] | None, text: str):
        err = (body or {}).get("error") or {}
        self.status = status
        self.type = err.get("type", "http_error")
        self.message = err.get("message", text[:300])
        self.request_id = (body or {}).get("request_id")
        super().__init__(f"{self.type}: {self.message}")


def admin_token(settings: GymSettings) -> str:
    if settings.admin_token:
        return settings.admin_token
    path = Path(settings.data_dir) / "admin-token"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise SystemExit(f"no admin token: set RSIGYM_ADMIN_TOKEN or start the gym (it writes {path})") from None


class AdminClient:
    def __init__(self, settings: GymSettings, url: str | None = None):
        self.http = httpx.Client(
            base_url=url or settings.url,
            headers={"Authorization": f"Bearer {admin_token(settings)}"},
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
            raise AdminError(response.status_code, body, response.text)
        return response.json()
