"""``/admin/ui``: the operator's live dashboard, server-rendered (Jinja2, inline SVG, no CDN).

A sub-application mounted on every gateway (embedded and distributed): it reads the shared
store, so any replica shows the same figures. Routes stay thin: one query function each, run
off the event loop, one template each. Every page but the login form needs a live UI session
(:mod:`ops.dashboard.session`, kept in the store); without one the browser is sent to the
login form. Form posts that change state — logout and the operator's actions on a run (top up,
pause, resume, stop, revoke: :mod:`ops.dashboard.actions`) — carry the session's CSRF token
(:data:`CsrfChecked`);
logins are rate-limited per client address (:mod:`ops.dashboard.login_limit`).

Errors answer a browser with a page and any other client with the gym's JSON error shape.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

import jinja2
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.context import Gateway
from kit.errors import GymError, PermissionDenied, RateLimited, error_response
from kit.http import NO_FASTAPI_TELEMETRY, request_id_of
from kit.settings import JobSettings
from ops.dashboard import queries
from ops.dashboard.actions import DONE_MESSAGES, perform
from ops.dashboard.charts import spend_chart
from ops.dashboard.lineage import layout
from ops.dashboard.login_limit import LoginLimiter
from ops.dashboard.session import (
    COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    LOGIN_COOKIE,
    PATH,
    Sessions,
    UiSession,
    csrf_matches,
    login_csrf,
    new_nonce,
    session_key,
    token_matches,
)
from ops.dashboard.settings import DashboardSettings

HERE = Path(__file__).parent
MAX_FORM_BODY = 4096
LOGIN_FORM_TTL_S = 3600
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


async def ui_session(request: Request) -> UiSession:
    """The browser's live UI session, or off to the login form. Only the session cookie counts:
    no header, no query parameter."""
    sessions: Sessions = request.app.state.sessions
    found = await sessions.store.call(sessions.find, request.cookies.get(COOKIE))
    if found is None:
        raise LoginRequired()
    request.state.ui_session = found
    return found


Authed = Annotated[UiSession, Depends(ui_session)]


async def form_fields(request: Request) -> dict[str, list[str]]:
    """A small url-encoded form body's fields (empty for any other or a larger body)."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    body = await request.body()
    return parse_qs(body.decode("utf-8", "replace")) if len(body) <= MAX_FORM_BODY else {}


async def csrf_checked(request: Request, session: Authed) -> UiSession:
    """A live session whose CSRF token came back with the request (the ``X-CSRF-Token`` header or
    the form's ``csrf_token`` field), or 403: what every state-changing dashboard route depends on."""
    presented = request.headers.get(CSRF_HEADER) or ((await form_fields(request)).get(CSRF_FIELD) or [""])[0]
    if not csrf_matches(session.csrf, presented):
        raise PermissionDenied("this form's CSRF token is missing or wrong: reload the page and try again",
                               param=CSRF_FIELD)
    return session


CsrfChecked = Annotated[UiSession, Depends(csrf_checked)]


def wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def client_address(request: Request) -> str:
    """The connection's peer as the HTTP server reports it (see ops/dashboard/login_limit.py)."""
    return request.client.host if request.client else "unknown"


# -- the app -------------------------------------------------------------------------------------


def create_dashboard_app(gw: Gateway, settings: DashboardSettings | None = None) -> FastAPI:  # noqa: C901 - the app factory declares every route inline
    settings = settings or DashboardSettings()
    job_settings = JobSettings()
    env = _templates()
    key = session_key(gw.admin_token, gw.internal_secret)
    sessions, limiter = Sessions(gw.store, key, settings), LoginLimiter(gw.store, settings)
    app = FastAPI(title="RSIGym dashboard", openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry=NO_FASTAPI_TELEMETRY)
    app.state.sessions = sessions

    def render(request: Request, template: str, status: int = 200, refresh: bool = True,
               headers: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
        """A page; a logged-in request's pages carry its CSRF token (a meta tag, the logout form)."""
        session: UiSession | None = getattr(request.state, "ui_session", None)
        context.setdefault("logged_in", session is not None)
        context.setdefault("csrf_token", session.csrf if session is not None else "")
        html = env.get_template(template).render(refresh_s=settings.refresh_s if refresh else 0, **context)
        return HTMLResponse(html, status_code=status, headers={**SECURITY_HEADERS, **(headers or {})})

    def secure(request: Request) -> bool:
        return settings.secure_cookie or request.url.scheme == "https"

    def login_page(request: Request, status: int = 200, error: str | None = None,
                   headers: dict[str, str] | None = None) -> HTMLResponse:
        """The login form, its CSRF token bound to the form's own cookie (kept if the browser has one)."""
        nonce = request.cookies.get(LOGIN_COOKIE) or ""
        if not (16 <= len(nonce) <= 64):
            nonce = new_nonce()
        response = render(request, "login.html", status, refresh=False, headers=headers, error=error,
                          logged_in=False, csrf_token=login_csrf(key, nonce))
        response.set_cookie(LOGIN_COOKIE, nonce, max_age=LOGIN_FORM_TTL_S, path=f"{PATH}/login", httponly=True,
                            samesite="strict", secure=secure(request))
        return response

    @app.exception_handler(LoginRequired)
    async def _to_login(_request: Request, _exc: LoginRequired) -> Response:
        return RedirectResponse(f"{PATH}/login", status_code=303, headers=SECURITY_HEADERS)

    @app.exception_handler(GymError)
    async def _gym_error(request: Request, exc: GymError) -> Response:
        if not wants_html(request):
            return error_response(exc, request_id_of(request))
        run_id = request.path_params.get("run_id") if request.method == "POST" else None
        return render(request, "error.html", exc.status, refresh=False, headers=exc.headers, message=exc.message,
                      code=exc.status, back=f"runs/{quote(run_id)}" if run_id else "")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return render(request, "error.html", exc.status_code, refresh=False, message=str(exc.detail),
                      logged_in=False, code=exc.status_code, back="")

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
        return login_page(request)

    @app.post("/login")
    async def login(request: Request) -> Response:
        """The token comes from the form body only: a token in the URL (query string) is ignored.
        The form's CSRF token first, then the rate limit, then the admin token."""
        fields = await form_fields(request)
        nonce = request.cookies.get(LOGIN_COOKIE) or ""
        if not nonce or not csrf_matches(login_csrf(key, nonce), (fields.get(CSRF_FIELD) or [""])[0]):
            if wants_html(request):
                return login_page(request, 403, "The login form expired; please log in again.")
            raise PermissionDenied("the login form's CSRF token is missing or wrong: load the form again",
                                   param=CSRF_FIELD)
        try:
            attempt = await gw.store.call(limiter.take, client_address(request))
        except RateLimited as err:
            if wants_html(request):
                return login_page(request, 429, err.message[:1].upper() + err.message[1:] + ".", headers=err.headers)
            raise
        if not token_matches((fields.get("token") or [""])[0].strip(), gw.admin_token):
            return login_page(request, 401, "That is not this gym's admin token.")
        await gw.store.call(limiter.give_back, attempt)
        session_id, _ = await gw.store.call(partial(sessions.start, replacing=request.cookies.get(COOKIE)))
        response = RedirectResponse(f"{PATH}/", status_code=303, headers=SECURITY_HEADERS)
        response.set_cookie(COOKIE, session_id, max_age=settings.session_ttl_s, path=PATH, httponly=True,
                            samesite="strict", secure=secure(request))
        response.delete_cookie(LOGIN_COOKIE, path=f"{PATH}/login", httponly=True, samesite="strict",
                               secure=secure(request))
        return response

    @app.post("/logout")
    async def logout(request: Request, _s: CsrfChecked) -> Response:
        """Ends the session in the store: the cookie is refused from now on, wherever it is."""
        await gw.store.call(sessions.end, request.cookies.get(COOKIE))
        response = RedirectResponse(f"{PATH}/login", status_code=303, headers=SECURITY_HEADERS)
        response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict", secure=secure(request))
        return response

    # -- pages ---------------------------------------------------------------------------------

    @app.get("/")
    async def overview(request: Request, _s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.overview, gw.store)
        return render(request, "overview.html", page="overview", **data)

    @app.get("/runs/{run_id}")
    async def run_detail(request: Request, run_id: str, _s: Authed, done: str = "") -> HTMLResponse:
        data = await gw.store.call(queries.run_detail, gw.store, run_id, settings.page_rows)
        graph = data.pop("graph")
        return render(request, "run.html", page="overview", chart=spend_chart(data.pop("spend")), graph=layout(graph),
                      graph_truncated=graph.truncated, done=DONE_MESSAGES.get(done, ""), **data)

    @app.post("/runs/{run_id}/{action}")
    async def run_action(request: Request, run_id: str, action: str, _s: CsrfChecked) -> Response:
        """Top up, pause, resume, stop or revoke a run (ops/dashboard/actions.py), then back to
        its page with a confirmation."""
        fields = {k: v[0] for k, v in (await form_fields(request)).items() if k != CSRF_FIELD}
        await gw.store.call(perform, gw.store, gw.registry, run_id, action, fields)
        return RedirectResponse(f"{PATH}/runs/{quote(run_id)}?done={action}", status_code=303,
                                headers=SECURITY_HEADERS)

    @app.get("/jobs")
    async def jobs(request: Request, _s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.jobs, gw.store, settings.page_rows, job_settings.heartbeat_ttl_s)
        return render(request, "jobs.html", page="jobs", heartbeat_ttl_s=job_settings.heartbeat_ttl_s, **data)

    @app.get("/scores")
    async def scores(request: Request, _s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.scores, gw.store, settings.page_rows)
        return render(request, "scores.html", page="scores", **data)

    @app.get("/leaderboard")
    async def leaderboard(request: Request, _s: Authed, split: str = "official") -> HTMLResponse:
        data = await gw.store.call(partial(queries.leaderboard, gw.store, split[:40]))
        return render(request, "leaderboard.html", page="leaderboard", **data)

    @app.get("/evaluation/{job_id}")
    async def evaluation(request: Request, job_id: str, _s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.evaluation_job, gw.store, job_id)
        return render(request, "evaluation.html", page="jobs", **data)

    @app.get("/evaluation/{job_id}/trials/{trial_id}")
    async def trial(request: Request, job_id: str, trial_id: int, _s: Authed) -> HTMLResponse:
        data = await gw.store.call(queries.trial, gw.store, job_id, trial_id)
        return render(request, "trial.html", page="jobs", refresh=False, **data)

    return app


def mount_dashboard(app: FastAPI, gw: Gateway) -> None:
    """Serve the dashboard under ``/admin/ui`` on ``app`` (call before any catch-all route)."""

    @app.get(PATH, include_in_schema=False)
    async def _dashboard_root() -> RedirectResponse:
        return RedirectResponse(f"{PATH}/", status_code=307)

    app.mount(PATH, create_dashboard_app(gw))
