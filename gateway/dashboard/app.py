"""``/admin/ui``: the operator's live dashboard, server-rendered (Jinja2, inline SVG, no CDN).

A sub-application mounted on every gateway (embedded and distributed): it reads the shared
store, so any replica shows the same figures. Routes stay thin: one query function each, run
off the event loop, one template each. Every page but the login form needs the UI session
cookie (:mod:`gateway.dashboard.session`); without it the browser is sent to the login form.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

import jinja2
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.context import Gateway
from gateway.dashboard import queries
from gateway.dashboard.charts import spend_chart
from gateway.dashboard.lineage import layout
from gateway.dashboard.session import COOKIE, PATH, Session, issue, session_key, token_matches, verify
from gateway.dashboard.settings import DashboardSettings
from services.core.errors import GymError
from services.core.http import NO_FASTAPI_TELEMETRY

HERE = Path(__file__).parent
MAX_LOGIN_BODY = 4096
SECURITY_HEADERS = {
    # Everything the pages need is served from here; inline scripts and handlers never run, so
    # text an agent wrote (trajectories, names) cannot become code even if escaping failed.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATIC = {"dashboard.css": "text/css; charset=utf-8", "refresh.js": "text/javascript; charset=utf-8"}


class LoginRequired(Exception):
    """No valid UI session: the browser goes to the login form."""


# -- formatting -----------------------------------------------------------------------------------


def format_usd(value: float | None) -> str:
    """USD with up to six decimals and at least two: 5 → $5.00, 0.0000584 → $0.000058."""
    if value is None:
        return "—"
    text = f"{value:,.6f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"${whole}.{frac.ljust(2, '0')}"


def format_score(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h {seconds % 3600 // 60}m"


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(usd=format_usd, score=format_score, age=format_age)
    env.globals["base"] = PATH
    return env


def ui_session(request: Request) -> Session:
    """The browser's UI session, or off to the login form. Only the signed cookie counts: no
    header, no query parameter."""
    found = verify(request.app.state.session_key, request.cookies.get(COOKIE))
    if found is None:
        raise LoginRequired()
    return found


Authed = Annotated[Session, Depends(ui_session)]


# -- the app -------------------------------------------------------------------------------------


def create_dashboard_app(gw: Gateway, settings: DashboardSettings | None = None) -> FastAPI:
    settings = settings or DashboardSettings()
    env = _templates()
    key = session_key(gw.admin_token, gw.internal_secret)
    app = FastAPI(title="RSIGym dashboard", openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry=NO_FASTAPI_TELEMETRY)
    app.state.session_key = key

    def render(template: str, status: int = 200, refresh: bool = True, **context: Any) -> HTMLResponse:
        html = env.get_template(template).render(refresh_s=settings.refresh_s if refresh else 0, **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    @app.exception_handler(LoginRequired)
    async def _to_login(_request: Request, _exc: LoginRequired) -> Response:
        return RedirectResponse(f"{PATH}/login", status_code=303, headers=SECURITY_HEADERS)

    @app.exception_handler(GymError)
    async def _gym_error(_request: Request, exc: GymError) -> Response:
        return render("error.html", exc.status, refresh=False, message=exc.message, logged_in=True)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        return render("error.html", exc.status_code, refresh=False, message=str(exc.detail), logged_in=False)

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in STATIC:
            raise StarletteHTTPException(404, "no such file")
        return Response((HERE / "static" / name).read_bytes(), media_type=STATIC[name],
                        headers={**SECURITY_HEADERS, "Cache-Control": "max-age=300"})

    # -- login ---------------------------------------------------------------------------------

    @app.get("/login")
    async def login_form(request: Request) -> Response:
        if request.url.query:  # e.g. ?token=…: never read; sent to the clean form, out of the address bar
            return RedirectResponse(f"{PATH}/login", status_code=303, headers=SECURITY_HEADERS)
        return render("login.html", refresh=False, error=None, logged_in=False)

    @app.post("/login")
    async def login(request: Request) -> Response:
        """The token comes from the form body only: a token in the URL (query string) is ignored."""
        body = await request.body()
        fields = parse_qs(body[:MAX_LOGIN_BODY].decode("utf-8", "replace")) if len(body) <= MAX_LOGIN_BODY else {}
        token = (fields.get("token") or [""])[0].strip()
        if not token_matches(token, gw.admin_token):
            return render("login.html", 401, refresh=False, error="That is not this gym's admin token.",
                          logged_in=False)
        response = RedirectResponse(f"{PATH}/", status_code=303, headers=SECURITY_HEADERS)
        response.set_cookie(COOKIE, issue(key, settings.session_ttl_s), max_age=settings.session_ttl_s, path=PATH,
                            httponly=True, samesite="strict",
                            secure=settings.secure_cookie or request.url.scheme == "https")
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        response = RedirectResponse(f"{PATH}/login", status_code=303, headers=SECURITY_HEADERS)
        response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict",
                               secure=settings.secure_cookie or request.url.scheme == "https")
        return response

    # -- pages ---------------------------------------------------------------------------------

    @app.get("/")
    async def overview(_s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.overview, gw.store)
        return render("overview.html", page="overview", **data)

    @app.get("/runs/{run_id}")
    async def run_detail(run_id: str, _s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.run_detail, gw.store, run_id, settings.page_rows)
        graph = data.pop("graph")
        return render("run.html", page="overview", chart=spend_chart(data.pop("spend")), graph=layout(graph),
                      graph_truncated=graph.truncated, **data)

    @app.get("/jobs")
    async def jobs(_s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.jobs, gw.store, settings.page_rows)
        return render("jobs.html", page="jobs", **data)

    @app.get("/scores")
    async def scores(_s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.scores, gw.store, settings.page_rows)
        return render("scores.html", page="scores", **data)

    @app.get("/leaderboard")
    async def leaderboard(_s: Authed, split: str = "official") -> HTMLResponse:
        data = await gw.store.call(partial(queries.leaderboard, gw.store, split[:40]))
        return render("leaderboard.html", page="leaderboard", **data)

    @app.get("/evaluation/{job_id}")
    async def evaluation(job_id: str, _s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.evaluation_job, gw.store, job_id)
        return render("evaluation.html", page="jobs", **data)

    @app.get("/evaluation/{job_id}/trials/{trial_id}")
    async def trial(job_id: str, trial_id: int, _s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.trial, gw.store, job_id, trial_id)
        return render("trial.html", page="jobs", refresh=False, **data)

    return app


def mount_dashboard(app: FastAPI, gw: Gateway) -> None:
    """Serve the dashboard under ``/admin/ui`` on ``app`` (call before any catch-all route)."""

    @app.get(PATH, include_in_schema=False)
    async def _dashboard_root() -> RedirectResponse:
        return RedirectResponse(f"{PATH}/", status_code=307)

    app.mount(PATH, create_dashboard_app(gw))
