"""The gateway's direct send to a service (gateway/service_link.py): the URL the client would
have built, the client's timeouts, and no cookie carried from one call to the next."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.asgi_transport import StreamingASGITransport
from gateway.proxy import wire_path
from gateway.service_link import ServiceLink
from tests.fakes.servers import serve

TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=60.0, pool=60.0)


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


@pytest.mark.parametrize("target", ["/v1/chat/completions", wire_path("/v1/files/a b?#%/..") + "?x=1&y=%20z",
                                    "/v2/sandboxes?metadata=a%3Db&state=running", "/v1/x?q=é ü", "/"])
def test_the_url_is_the_one_the_client_builds(target: str) -> None:
    link = ServiceLink("http://rollout.internal", StreamingASGITransport(Recorder()), TIMEOUT)
    built = link.client.build_request("POST", target).url
    app = Recorder()

    async def go() -> None:
        link.transport = StreamingASGITransport(app)
        response = await link.send("POST", target, {"x-request-id": "req_1"}, b"{}")
        assert str(response.request.url) == str(built)
        await response.aread()
        await response.aclose()

    asyncio.run(go())
    assert app.seen[0]["raw_path"] == built.raw_path.split(b"?")[0] and app.seen[0]["query"] == built.query


def test_no_cookie_is_carried_to_the_next_call() -> None:
    """One key's call is answered with a cookie; the next call (another key's) must not carry it."""
    app = Recorder()
    link = ServiceLink("http://sandbox.internal", StreamingASGITransport(app), TIMEOUT)

    async def go() -> list[str]:
        got = []
        for key in ("key-a", "key-b"):
            response = await link.send("POST", "/v2/sandboxes", {"x-key": key}, b"{}")
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
                await link.send("POST", "/v1/slow", {}, b"{}")
            finally:
                await link.aclose()

        with pytest.raises(httpx.ReadTimeout):
            asyncio.run(go())
