"""The dashboard's server-side sessions, CSRF tokens and login rate limit, attacked over HTTP on
SQLite and PostgreSQL (ops/dashboard/session.py, login_limit.py).

The attacker holds a copy of an operator's session cookie (taken before a logout), posts forms
from another site (no CSRF token, or one it made up), or guesses admin tokens. "Replicas" are
second dashboard apps on the same store through a Store object of their own: nothing but the
store is shared, as between gateway replicas.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from access.operator_sessions import DashboardSession, LoginFailureCounter
from kit.errors import RateLimited
from kit.settings import StoreSettings
from ops.builder import Gym
from ops.dashboard.app import create_dashboard_app
from ops.dashboard.login_limit import LoginLimiter
from ops.dashboard.session import COOKIE, LOGIN_COOKIE, PATH, Sessions, id_hash, session_key
from ops.dashboard.settings import DashboardSettings
from storage.store import Store
from storage.tables import utcnow
from tests.conftest import ADMIN_TOKEN

HTML = {"Accept": "text/html"}
LIMITS = DashboardSettings(login_failures_per_address=3, login_failures_total=5, login_window_s=3600)
"""A replica's small limits (the gym's own dashboard keeps the defaults, 10 and 100)."""


@pytest.fixture
def gym(make_gym: Callable[..., Gym], store: Store) -> Gym:
    return make_gym(store=store)


def client(app: Any, address: str = "203.0.113.7") -> TestClient:
    return TestClient(app, base_url="http://gym", client=(address, 40000), follow_redirects=False)


@pytest.fixture
def replica(gym: Gym) -> Iterator[Callable[..., FastAPI]]:
    """Another gateway's dashboard on the same store: its own Store object (own pool), the
    gym's internal secret, the given admin token and settings."""
    own = gym.gateway.store
    stores: list[Store] = []

    def make(admin_token: str = ADMIN_TOKEN, settings: DashboardSettings | None = None) -> FastAPI:
        other = Store(own.url, StoreSettings(), schema=own.schema)
        stores.append(other)
        gw = SimpleNamespace(admin_token=admin_token, internal_secret=gym.gateway.internal_secret, store=other)
        app = FastAPI()
        app.mount(PATH, create_dashboard_app(gw, settings))  # type: ignore[arg-type]
        return app

    yield make
    for s in stores:
        s.dispose()


def form_token(page: str) -> str:
    return page.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]


def login(c: TestClient, token: str = ADMIN_TOKEN) -> Any:
    """The login form, then its post, as a browser sends them."""
    csrf = form_token(c.get(f"{PATH}/login").text)
    return c.post(f"{PATH}/login", data={"token": token, "csrf_token": csrf})


def logged_in(c: TestClient) -> tuple[str, str]:
    """Log in: (the session cookie's value, the session's CSRF token from a page)."""
    r = login(c)
    assert r.status_code == 303 and r.headers["location"] == f"{PATH}/", r.text
    page = c.get(f"{PATH}/jobs")
    assert page.status_code == 200
    csrf = page.text.split('<meta name="csrf-token" content="', 1)[1].split('"', 1)[0]
    assert form_token(page.text) == csrf  # the logout form carries the same token
    return c.cookies[COOKIE], csrf


def opens(app: Any, cookie: str, path: str = "/jobs") -> bool:
    """Whether a bare client holding only ``cookie`` gets the page (not the login form)."""
    r = client(app, "198.51.100.9").get(PATH + path, headers={"Cookie": f"{COOKIE}={cookie}"})
    assert r.status_code in (200, 303), r.text
    return r.status_code == 200


def rows(store: Store) -> list[DashboardSession]:
    with store.transaction() as s:
        return list(s.scalars(select(DashboardSession)))


def test_a_cookie_copied_before_logout_is_refused_after_it_on_every_replica(gym: Gym, replica: Any) -> None:
    operator = client(gym.app)
    cookie, csrf = logged_in(operator)
    other = replica()
    assert opens(gym.app, cookie) and opens(other, cookie)  # the copy works while the session lives
    (row,) = rows(gym.gateway.store)
    assert row.id_hash == id_hash(session_key(ADMIN_TOKEN, gym.gateway.internal_secret), cookie) != cookie
    # the operator logs out on one replica ...
    out = client(other).post(f"{PATH}/logout", data={"csrf_token": csrf}, headers={"Cookie": f"{COOKIE}={cookie}"})
    assert (out.status_code, out.headers["location"]) == (303, f"{PATH}/login")
    assert f'{COOKIE}=""' in out.headers["set-cookie"] and "Max-Age=0" in out.headers["set-cookie"]
    assert rows(gym.gateway.store) == []
    # ... and the copy is refused at once, on both
    assert not opens(gym.app, cookie) and not opens(other, cookie)
    # nothing revives it: not its old CSRF token on a logout, not another login, not time
    again = client(gym.app).post(f"{PATH}/logout", data={"csrf_token": csrf}, headers={"Cookie": f"{COOKIE}={cookie}"})
    assert (again.status_code, again.headers["location"]) == (303, f"{PATH}/login")
    fresh, _ = logged_in(client(gym.app))
    assert fresh != cookie and opens(gym.app, fresh) and not opens(gym.app, cookie)


def test_a_login_replaces_the_browsers_old_session(gym: Gym) -> None:
    operator = client(gym.app)
    first, _ = logged_in(operator)
    second, _ = logged_in(operator)  # the browser still sends the first cookie with the login
    assert first != second and not opens(gym.app, first) and opens(gym.app, second)
    assert len(rows(gym.gateway.store)) == 1


def test_rotating_the_admin_token_ends_every_session(gym: Gym, replica: Any) -> None:
    cookie, _ = logged_in(client(gym.app))
    rotated = replica(admin_token="rsa-rotated-admin-token")
    assert opens(gym.app, cookie) and not opens(rotated, cookie)
    assert login(client(rotated)).status_code == 401  # the old token no longer logs in there
    new = client(rotated)
    assert login(new, "rsa-rotated-admin-token").status_code == 303
    assert opens(rotated, new.cookies[COOKIE]) and not opens(gym.app, new.cookies[COOKIE])


def test_state_changing_posts_need_the_sessions_csrf_token(gym: Gym) -> None:
    operator = client(gym.app)
    cookie, csrf = logged_in(operator)
    _, someone_elses = logged_in(client(gym.app, "192.0.2.44"))
    sent = {"Cookie": f"{COOKIE}={cookie}"}
    bare = client(gym.app, "198.51.100.9")
    for data, headers in (({}, {}), ({"csrf_token": ""}, {}), ({"csrf_token": "forged-" + csrf[7:]}, {}),
                          ({"csrf_token": someone_elses}, {}), ({}, {"X-CSRF-Token": someone_elses})):
        r = bare.post(f"{PATH}/logout", data=data, headers={**sent, **headers})
        assert r.status_code == 403, (data, headers)
        assert r.json()["error"]["type"] == "permission_denied" and r.json()["type"] == "error"
    page = bare.post(f"{PATH}/logout", data={"csrf_token": "x"}, headers={**sent, **HTML})
    assert page.status_code == 403 and "CSRF token" in page.text and "<html" in page.text
    assert opens(gym.app, cookie)  # no forged logout ended the session
    # the header works as well as the form field (for the scripted actions to come)
    r = bare.post(f"{PATH}/logout", headers={**sent, "X-CSRF-Token": csrf})
    assert r.status_code == 303 and not opens(gym.app, cookie)


def test_the_login_form_needs_its_own_csrf_token(gym: Gym) -> None:
    attacker = client(gym.app)
    r = attacker.post(f"{PATH}/login", data={"token": ADMIN_TOKEN})  # no form cookie, no field
    assert r.status_code == 403 and r.json()["error"]["param"] == "csrf_token" and COOKIE not in r.cookies
    victim = client(gym.app)
    csrf = form_token(victim.get(f"{PATH}/login").text)
    r = attacker.post(f"{PATH}/login", data={"token": ADMIN_TOKEN, "csrf_token": csrf})  # a token for another nonce
    assert r.status_code == 403 and COOKIE not in r.cookies
    r = attacker.post(f"{PATH}/login", data={"token": ADMIN_TOKEN, "csrf_token": csrf}, headers=HTML,
                      cookies={LOGIN_COOKIE: "n" * 32})
    assert r.status_code == 403 and "expired" in r.text and COOKIE not in r.cookies
    assert victim.post(f"{PATH}/login", data={"token": ADMIN_TOKEN, "csrf_token": csrf}).status_code == 303


def test_brute_force_gets_429_while_the_operator_elsewhere_logs_in(gym: Gym) -> None:
    attacker = client(gym.app, "203.0.113.66")
    for i in range(10):  # the default: 10 failures per address and window
        assert login(attacker, f"rsa-guess-{i}").status_code == 401
    refused = login(attacker, "rsa-guess-10")
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
    assert refused.json()["error"]["type"] == "rate_limited" and refused.json()["type"] == "error"
    assert login(attacker).status_code == 429  # even the right token: no more tries from there
    page = client(gym.app, "203.0.113.66").post(f"{PATH}/login", headers=HTML, data={
        "token": "x", "csrf_token": form_token(attacker.get(f"{PATH}/login").text)},
        cookies={LOGIN_COOKIE: attacker.cookies[LOGIN_COOKIE]})
    assert page.status_code == 429 and "Too many failed logins" in page.text and page.headers["retry-after"]
    cookie, _ = logged_in(client(gym.app, "192.0.2.10"))  # the operator, from another address
    assert opens(gym.app, cookie)


def test_the_global_limit_holds_across_addresses_and_replicas(gym: Gym, replica: Any) -> None:
    one, two = replica(settings=LIMITS), replica(settings=LIMITS)
    for i in range(3):
        assert login(client(one, "203.0.113.1"), f"rsa-guess-{i}").status_code == 401
    assert login(client(two, "203.0.113.1"), "rsa-guess-3").status_code == 429  # its address's 3 are used up
    for i in range(2):
        assert login(client(two, "203.0.113.2"), f"rsa-guess-{i}").status_code == 401
    # 5 failures in all: every login waits for the window's end, the right token from a fresh address too
    r = login(client(one, "192.0.2.10"))
    assert r.status_code == 429 and "to this dashboard" in r.json()["error"]["message"]


def test_concurrent_guesses_never_pass_the_limit(gym: Gym) -> None:
    """Twenty guesses at once from one address through two Store objects: exactly the limit's
    three are counted, the rest refused — the counter is taken atomically, like the ledger's."""
    own = gym.gateway.store
    other = Store(own.url, StoreSettings(), schema=own.schema)
    limiters = [LoginLimiter(own, LIMITS), LoginLimiter(other, LIMITS)]
    taken, refused = [], []
    barrier = threading.Barrier(20)

    def guess(i: int) -> None:
        barrier.wait()
        try:
            taken.append(limiters[i % 2].take("203.0.113.99"))
        except RateLimited:
            refused.append(i)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.dispose()
    assert (len(taken), len(refused)) == (3, 17)
    with own.transaction() as s:
        counts = {c.bucket: c.failures for c in s.scalars(select(LoginFailureCounter))}
    assert counts == {"addr:203.0.113.99": 3, "all": 3}
    limiters[0].give_back(taken[0])  # a right token's attempt is not a failure
    with own.transaction() as s:
        assert {c.bucket: c.failures for c in s.scalars(select(LoginFailureCounter))} == {
            "addr:203.0.113.99": 2, "all": 2}


def test_idle_and_absolute_expiry_end_a_session(store: Store) -> None:
    settings = DashboardSettings(session_idle_s=600, session_ttl_s=3600)
    sessions = Sessions(store, b"k" * 32, settings)
    now = utcnow()
    sid, _ = sessions.start(now=now)
    assert sessions.find(sid, now=now + timedelta(seconds=590)) is not None  # used: idle counts from here
    assert sessions.find(sid, now=now + timedelta(seconds=1180)) is not None
    assert sessions.find(sid, now=now + timedelta(seconds=1790)) is None  # 610 s unused
    assert rows(store) == []  # the expired row went with the refusal
    sid, _ = sessions.start(now=now)
    for minutes in range(9, 60, 9):  # busy all along ...
        assert sessions.find(sid, now=now + timedelta(minutes=minutes)) is not None
    assert sessions.find(sid, now=now + timedelta(seconds=3600)) is None  # ... but 1 h is the most
    assert Sessions(store, b"k" * 32, settings).find("x" * 500) is None


def test_session_ids_are_never_logged_nor_stored(gym: Gym, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    operator = client(gym.app)
    cookie, csrf = logged_in(operator)
    operator.get(f"{PATH}/")
    operator.post(f"{PATH}/logout", data={"csrf_token": csrf})
    assert any(r.name == "rsigym.access" for r in caplog.records)  # the access log did log these calls ...
    assert cookie not in caplog.text and csrf not in caplog.text  # ... and no session id nor CSRF token
    logged_in(operator)
    with gym.gateway.store.transaction() as s:
        stored = [str(v) for r in s.execute(select(DashboardSession.__table__)) for v in r]
    assert stored and not any(cookie in v or operator.cookies[COOKIE] in v for v in stored)
