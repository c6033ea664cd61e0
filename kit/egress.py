"""The research agent's egress allowlist: a small HTTP proxy that lets through only the hosts a
task names (``[egress] allow`` in task.toml) and refuses everything else.

The agent's namespaces (embedded launcher) or container (compose ``agentnet``) have no route out;
the gateway is their one peer. A task may allow a few more hosts (a package index, say); the agent
then reaches them through this proxy, set as its ``HTTPS_PROXY`` / ``HTTP_PROXY``, which pip,
curl, httpx, requests and urllib honour:

* ``CONNECT host:port`` (TLS tunnels: the proxy never sees the bytes) and absolute-form plain HTTP
  (``GET http://host/path``, re-sent in origin form) are served; nothing else.
* An allow entry is ``host`` (ports 80 and 443), ``host:port``, or ``*.domain[:port]`` (subdomains
  only). Names compare case-insensitively; an IP address matches only when written as one.
* A name that resolves to a loopback, private, link-local or otherwise non-public address is
  refused even when allowed (DNS rebinding onto the store or the metadata service); only an
  entry that *is* such an address, written by the operator, reaches one. The proxy connects to the
  address it checked, not a fresh resolution.
* Refusals are ``403`` with the gym's standard error body (``permission_denied``, param
  ``egress``); each decision is appended to a log (the run directory's ``egress.log``).
* With a run's credential (compose mode: ``RSIGYM_EGRESS_TOKEN``, which the run's agent has in its
  proxy URL, ``http://run:TOKEN@…``), a request without that ``Proxy-Authorization`` is ``407``:
  a proxy reached by anyone but its run's agent serves nobody. The header never goes upstream.

Embedded mode: the launcher's supervisor serves this on a Unix socket the in-namespace relay
exposes at ``127.0.0.1:8701``. Compose mode: ``rsigym egress-proxy`` is the ``egress`` service (one
per run, started by the launcher with the task's allowlist in ``RSIGYM_EGRESS_ALLOW``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kit.errors import AuthenticationFailed, GymError, PermissionDenied
from kit.namespace_relay import _pipe

HEAD_LIMIT = 16 * 1024
"""Bytes of request line and headers the proxy reads before refusing (431)."""
HEAD_TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 15.0
DEFAULT_PORTS = (80, 443)


@dataclass(frozen=True)
class AllowEntry:
    host: str
    port: int | None
    wildcard: bool

    @classmethod
    def parse(cls, text: str) -> AllowEntry:
        text = text.strip().lower()
        host, sep, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
        if not sep:
            host = text
        wildcard = host.startswith("*.")
        return cls(host[2:] if wildcard else host, int(port) if port else None, wildcard)

    def matches(self, host: str, port: int) -> bool:
        if (self.port is None and port not in DEFAULT_PORTS) or (self.port is not None and self.port != port):
            return False
        return host.endswith("." + self.host) if self.wildcard else host == self.host

    @property
    def is_address(self) -> bool:
        return _address(self.host) is not None


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


class EgressPolicy:
    """Which (host, port) the agent may reach. Empty: nothing."""

    def __init__(self, allow: Sequence[str]):
        self.entries = [AllowEntry.parse(a) for a in allow if a.strip()]

    @classmethod
    def from_env(cls, value: str | None) -> EgressPolicy:
        return cls([] if not value else value.replace(",", " ").split())

    def entry_for(self, host: str, port: int) -> AllowEntry | None:
        host = host.lower().rstrip(".")
        return next((e for e in self.entries if e.matches(host, port)), None)


def proxy_env(proxy_url: str, gateway_host: str) -> dict[str, str]:
    """What points pip, curl, httpx, requests and urllib at the egress proxy (both spellings:
    curl reads only the lower-case ``http_proxy``); the gateway's own host stays direct."""
    no_proxy = f"{gateway_host},localhost,127.0.0.1"
    return {"HTTPS_PROXY": proxy_url, "HTTP_PROXY": proxy_url, "https_proxy": proxy_url, "http_proxy": proxy_url,
            "NO_PROXY": no_proxy, "no_proxy": no_proxy}


Resolver = Callable[[str, int], list[str]]


def _resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def decide(policy: EgressPolicy, host: str, port: int, resolve: Resolver = _resolve) -> str:
    """The address to connect to for ``host:port``, or :class:`PermissionDenied`."""
    host = host.lower().rstrip(".")
    entry = policy.entry_for(host, port)
    if entry is None:
        raise PermissionDenied(f"egress to {host}:{port} is not in this run's allowlist", param="egress")
    if entry.is_address:
        return host.strip("[]")
    try:
        addresses = resolve(host, port)
    except OSError as err:
        raise PermissionDenied(f"egress to {host}:{port}: cannot resolve ({err})", param="egress") from None
    public = [a for a in addresses if (ip := _address(a)) is not None and ip.is_global]
    if not public or len(public) != len(addresses):
        raise PermissionDenied(f"egress to {host}:{port} resolves to a non-public address", param="egress")
    return public[0]


PROXY_AUTH = b"proxy-authorization"
HOP_HEADERS = (PROXY_AUTH, b"proxy-connection")
"""Headers meant for this proxy: never forwarded upstream."""


def _refusal(status: int, reason: str, err: GymError | None = None, message: str = "", extra: str = "") -> bytes:
    body = json.dumps(err.body(None) if err else
                      {"type": "error", "error": {"type": "invalid_request_error", "message": message, "param": "egress"},
                       "request_id": None, "code": status, "message": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n").encode() + body


def _headers(rest: bytes) -> list[tuple[bytes, bytes]]:
    """(lower-cased name, value) of each header line of a request head (after its request line)."""
    out = []
    for line in rest.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if sep:
            out.append((name.strip().lower(), value.strip()))
    return out


def credential_ok(rest: bytes, token: str) -> bool:
    """Whether the head carries ``Proxy-Authorization: Basic`` with ``token`` as its password (any
    user name), compared in constant time."""
    for name, value in _headers(rest):
        if name != PROXY_AUTH:
            continue
        scheme, _, encoded = value.partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            _, _, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(password, token.encode())
    return False


def _without_hop_headers(rest: bytes) -> bytes:
    lines = rest.split(b"\r\n")
    return b"\r\n".join(line for line in lines if not (b":" in line and
                                                      line.partition(b":")[0].strip().lower() in HOP_HEADERS))


def _split_target(target: str, default_port: int) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or host.endswith(":"):  # no port, or a bare IPv6 address
        return target.strip("[]"), default_port
    return host.strip("[]"), int(port)


class EgressProxy:
    """Serves one connection at a time per call of :meth:`handle` (``asyncio.start_server`` /
    ``start_unix_server`` callback)."""

    def __init__(self, policy: EgressPolicy, log: Path | None = None, resolve: Resolver = _resolve,
                 token: str | None = None):
        """``token``: the run's credential; None (embedded mode: a socket only the run's agent has)
        serves every client."""
        self.policy, self.log, self.resolve, self.token = policy, log, resolve, token

    def _record(self, host: str, port: int, allowed: bool, reason: str = "") -> None:
        if self.log is None:
            return
        line = {"at": time.time(), "host": host, "port": port, "allowed": allowed, "reason": reason}
        with self.log.open("a") as fh:
            fh.write(json.dumps(line) + "\n")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            if not writer.is_closing():
                writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            writer.write(_refusal(431, "Request Header Fields Too Large", message="request head too large"))
            await writer.drain()
            return
        line, _, rest = head.partition(b"\r\n")
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            writer.write(_refusal(400, "Bad Request", message="not an HTTP/1.x proxy request"))
            await writer.drain()
            return
        method, target, version = parts
        if method.upper() == "CONNECT":
            host, port = _split_target(target, 443)
            forward = b""
        elif target.lower().startswith("http://"):
            authority, _, path = target[7:].partition("/")
            host, port = _split_target(authority.rpartition("@")[2], 80)
            forward = f"{method} /{path} {version}\r\n".encode("latin-1") + _without_hop_headers(rest)
        else:
            writer.write(_refusal(400, "Bad Request", message="only CONNECT and absolute http:// requests are proxied"))
            await writer.drain()
            return
        if self.token is not None and not credential_ok(rest, self.token):
            self._record(host, port, False, "no valid run credential")
            writer.write(_refusal(407, "Proxy Authentication Required",
                                  AuthenticationFailed("this egress proxy serves its own run's agent only (proxy "
                                                       "credentials missing or wrong)", param="egress"),
                                  extra='Proxy-Authenticate: Basic realm="rsigym-egress"\r\n'))
            await writer.drain()
            return
        try:
            address = decide(self.policy, host, port, self.resolve)
        except PermissionDenied as err:
            self._record(host, port, False, err.message)
            writer.write(_refusal(403, "Forbidden", err))
            await writer.drain()
            return
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as err:
            self._record(host, port, False, f"connect failed: {err}")
            writer.write(_refusal(502, "Bad Gateway", message=f"cannot connect to {host}:{port}"))
            await writer.drain()
            return
        self._record(host, port, True)
        if forward:
            up_w.write(forward)
        else:
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))


async def serve_tcp(policy: EgressPolicy, host: str, port: int, log: Path | None = None,
                    token: str | None = None) -> None:
    proxy = EgressProxy(policy, log, token=token)
    server = await asyncio.start_server(proxy.handle, host, port, limit=HEAD_LIMIT)
    async with server:
        await server.serve_forever()
