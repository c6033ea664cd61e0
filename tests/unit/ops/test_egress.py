"""The agent's egress allowlist proxy (kit/egress.py), played as an agent that wants out:
names outside the list, a listed name that resolves onto the host's loopback or private network
(DNS rebinding toward the store), ports the entry does not name, malformed and oversized heads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from kit.egress import HEAD_LIMIT, EgressPolicy, EgressProxy, decide
from kit.errors import PermissionDenied


def resolver(table: dict[str, list[str]]) -> Callable[[str, int], list[str]]:
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("no such host")
        return table[host]
    return resolve


PUBLIC = resolver({"pypi.org": ["151.101.0.223"], "files.pythonhosted.org": ["151.101.64.223"],
                   "evil.example.com": ["127.0.0.1"], "mixed.example.com": ["151.101.0.1", "10.0.0.5"],
                   "example.com": ["93.184.215.14"]})


@pytest.mark.parametrize(("allow", "host", "port", "ok"), [
    (["pypi.org"], "pypi.org", 443, True),
    (["pypi.org"], "PyPI.org.", 80, True),
    (["pypi.org"], "pypi.org", 8443, False),  # no port written: 80 and 443 only
    (["pypi.org:8443"], "pypi.org", 8443, True),
    (["pypi.org:8443"], "pypi.org", 443, False),
    (["*.pythonhosted.org"], "files.pythonhosted.org", 443, True),
    (["*.pythonhosted.org"], "pythonhosted.org", 443, False),  # subdomains only
    (["*.example.com"], "evil.example.com", 443, False),  # allowed name, loopback address: rebinding
    (["*.example.com"], "mixed.example.com", 443, False),  # one private address is enough to refuse
    (["example.com"], "notexample.com", 443, False),
    (["example.com"], "example.com.evil.net", 443, False),
    ([], "pypi.org", 443, False),
    (["127.0.0.2:9000"], "127.0.0.2", 9000, True),  # an address the operator wrote is reached as written
    (["pypi.org"], "127.0.0.1", 443, False),
    (["pypi.org"], "nosuch.invalid", 443, False),
])
def test_decide(allow: list[str], host: str, port: int, ok: bool) -> None:
    policy = EgressPolicy(allow)
    if ok:
        assert decide(policy, host, port, PUBLIC)
    else:
        with pytest.raises(PermissionDenied) as err:
            decide(policy, host, port, PUBLIC)
        assert err.value.param == "egress"


def test_from_env_splits_on_space_and_comma() -> None:
    assert [(e.host, e.port, e.wildcard) for e in EgressPolicy.from_env("pypi.org, *.a.b:8080  c.d").entries] == [
        ("pypi.org", None, False), ("a.b", 8080, True), ("c.d", None, False)]
    assert EgressPolicy.from_env(None).entries == [] and EgressPolicy.from_env("").entries == []


async def _exchange(proxy: EgressProxy, request: bytes) -> bytes:
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, limit=HEAD_LIMIT)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    return answer


async def _upstream() -> tuple[asyncio.Server, int, list[bytes]]:
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.2", 0)
    return server, server.sockets[0].getsockname()[1], seen


def test_refusals_are_403_in_the_standard_shape_and_logged(tmp_path: object) -> None:
    from pathlib import Path

    log = Path(str(tmp_path)) / "egress.log"
    proxy = EgressProxy(EgressPolicy(["pypi.org"]), log=log, resolve=PUBLIC)
    answer = asyncio.run(_exchange(proxy, b"CONNECT 10.0.0.1:5432 HTTP/1.1\r\nHost: 10.0.0.1:5432\r\n\r\n"))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403")
    assert json.loads(body)["error"] == {"type": "permission_denied", "param": "egress",
                                         "message": "egress to 10.0.0.1:5432 is not in this run's allowlist"}
    assert [(d["host"], d["port"], d["allowed"]) for d in map(json.loads, log.read_text().splitlines())] == [
        ("10.0.0.1", 5432, False)]


def test_connect_and_absolute_http_reach_an_allowed_host() -> None:
    async def scenario() -> tuple[bytes, bytes, list[bytes]]:
        server, port, seen = await _upstream()
        async with server:
            proxy = EgressProxy(EgressPolicy([f"127.0.0.2:{port}"]))
            plain = await _exchange(proxy, f"GET http://127.0.0.2:{port}/simple/x HTTP/1.1\r\n"
                                           f"Host: 127.0.0.2:{port}\r\n\r\n".encode())
            tunnel = await _exchange(proxy, f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n"
                                            f"GET / HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return plain, tunnel, seen

    plain, tunnel, seen = asyncio.run(scenario())
    assert plain.startswith(b"HTTP/1.1 200 OK") and plain.endswith(b"ok")
    assert tunnel.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200 OK")
    assert seen[0].startswith(b"GET /simple/x HTTP/1.1\r\n")  # re-sent in origin form


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /relative HTTP/1.1\r\n\r\n", b"400"),
    (b"NONSENSE\r\n\r\n", b"400"),
    (b"CONNECT pypi.org:443 HTTP/1.1\r\nX: " + b"a" * (HEAD_LIMIT + 10) + b"\r\n\r\n", b"431"),
])
def test_malformed_and_oversized_heads_are_refused(request_bytes: bytes, status: bytes) -> None:
    answer = asyncio.run(_exchange(EgressProxy(EgressPolicy(["pypi.org"]), resolve=PUBLIC), request_bytes))
    assert answer.split(b" ")[1] == status


def test_a_runs_proxy_serves_only_clients_with_its_credential_and_keeps_it_from_upstream() -> None:
    """Compose mode: the proxy of one run, reached by anyone else (no credential, another run's, a
    malformed one), answers 407 in the standard shape; its own run's credential is let through and
    never forwarded to the upstream host."""
    import base64

    def auth(user_password: bytes) -> bytes:
        return b"Proxy-Authorization: Basic " + base64.b64encode(user_password) + b"\r\n"

    async def scenario() -> tuple[list[bytes], bytes, bytes, list[bytes]]:
        server, port, seen = await _upstream()
        async with server:
            proxy = EgressProxy(EgressPolicy([f"127.0.0.2:{port}"]), token="this-runs-token")
            get = f"GET http://127.0.0.2:{port}/x HTTP/1.1\r\nHost: 127.0.0.2:{port}\r\n".encode()
            refused = [await _exchange(proxy, get + header + b"\r\n") for header in (
                b"", auth(b"run:another-runs-token"), auth(b"this-runs-token"), b"Proxy-Authorization: Bearer x\r\n",
                b"Proxy-Authorization: Basic !!!\r\n")]
            refused.append(await _exchange(proxy, f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n".encode()))
            plain = await _exchange(proxy, get + auth(b"run:this-runs-token") + b"Proxy-Connection: keep-alive\r\n\r\n")
            tunnel = await _exchange(proxy, f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n".encode()
                                     + auth(b"run:this-runs-token") + b"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return refused, plain, tunnel, seen

    refused, plain, tunnel, seen = asyncio.run(scenario())
    for answer in refused:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 407") and b'Proxy-Authenticate: Basic realm="rsigym-egress"' in head, head
        assert json.loads(body)["error"]["type"] == "authentication_error"
    assert plain.startswith(b"HTTP/1.1 200 OK") and tunnel.startswith(b"HTTP/1.1 200 Connection Established")
    assert len(seen) == 2 and all(b"this-runs-token" not in s and b"roxy-" not in s for s in seen), seen
