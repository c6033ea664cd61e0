"""The gateway's direct send to a service (gateway/service_link.py): the URL the client would
have built, signed for the path the service routes, the client's timeouts, and no cookie carried
from one call to the next."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from gateway.asgi_transport import StreamingASGITransport
from gateway.service_call import ServiceCall
from gateway.service_link import ServiceLink
from kit.identity import Identity, verify
from tests.fakes.servers import serve

TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=60.0, pool=60.0)
SECRET = "link-secret"


def _call(path: str, query: str = "", headers: dict[str, str] | None = None) -> ServiceCall:
    identity = Identity(request_id="req_1", key_id="key_a", run_id="key_a", service="rollout", operation="chat",
                        issued_at=time.time())
    return ServiceCall("POST", path, query, headers or {"x-request-id": "req_1"}, b"{}", identity, SECRET)


class Recorder:
    """An ASGI service that remembers what reached it and sets a cookie on every answer."""

    def __init__(self, delay_s: float = 0.0):
        self.seen: list[dict[str, Any]] = []
        self.delay_s = delay_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = (await receive()).get("body", b"")
        self.seen.append({"path": scope["path"], "raw_path": scope.get("raw_path"), "query": scope["query_string"],
                          "headers": dict(scope["headers"]), "body": body})
        await asyncio.sleep(self.delay_s)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"set-cookie", b"session=of-key-a; Path=/")]})
        await send({"type": "http.response.body", "body": b'{"ok":true}'})


@pytest.mark.parametrize(("path", "query"), [("/v1/chat/completions", ""), ("/v1/files/a b?#%/..", "x=1&y=%20z"),
                                           ("/v2/sandboxes", "metadata=a%3Db&state=running"), ("/v1/x", "q=é ü"),
                                           ("/", "")])
def test_the_url_is_the_one_the_client_builds_and_signed_for_the_routed_path(path: str, query: str) -> None:
    app = Recorder()
    link = ServiceLink("http://rollout.internal", StreamingASGITransport(app), TIMEOUT)
    call = _call(path, query)
    built = link.client.build_request("POST", call.target).url

    async def go() -> None:
        response = await link.send(call)
        assert isinstance(response, httpx.Response) and str(response.request.url) == str(built)
        await response.aread()
        await response.aclose()

    asyncio.run(go())
    seen = app.seen[0]
    assert seen["raw_path"] == built.raw_path.split(b"?")[0] and seen["query"] == built.query
    assert seen["path"] == path
    # signed for the decoded path and the query as it travels (as the gateway receives one)
    if query.isascii():
        target = path + (f"?{seen['query'].decode()}" if seen["query"] else "")
        assert verify(httpx.Headers(seen["headers"]), SECRET, "POST", target, seen["body"]).key_id == "key_a"


def test_no_cookie_is_carried_to_the_next_call() -> None:
    """One key's call is answered with a cookie; the next call (another key's) must not carry it."""
    app = Recorder()
    link = ServiceLink("http://sandbox.internal", StreamingASGITransport(app), TIMEOUT)

    async def go() -> list[str]:
        got = []
        for key in ("key-a", "key-b"):
            response = await link.send(_call("/v2/sandboxes", headers={"x-key": key}))
            got.append(response.headers.get("set-cookie", ""))
            await response.aread()
            await response.aclose()
        return got

    answers = asyncio.run(go())
    assert answers == ["session=of-key-a; Path=/"] * 2  # the caller still gets the service's answer as it was
    assert [b"cookie" in s["headers"] for s in app.seen] == [False, False]


def test_over_http_the_clients_read_timeout_holds() -> None:
    with serve(Recorder(delay_s=2.0)) as url:
        link = ServiceLink(url, httpx.AsyncHTTPTransport(), httpx.Timeout(connect=5.0, read=0.3, write=5.0, pool=5.0))

        async def go() -> None:
            try:
                await link.send(_call("/v1/slow"))
            finally:
                await link.aclose()

        with pytest.raises(httpx.ReadTimeout):
            asyncio.run(go())
