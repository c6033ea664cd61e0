"""One proxied call as the gateway hands it to a service, and the one seam every way of reaching a
service implements (:class:`ServiceTransport`).

The gateway's ``forward`` builds a :class:`ServiceCall` — the request and the :class:`Identity`
the gateway vouches for — and hands it to the service's transport; it never decides how the
identity travels. The transport does, by what it is:

* a call that crosses a boundary (the network, or the service's whole ASGI app in process) is
  signed (:meth:`ServiceCall.signed_headers`) and verified by the service from its headers:
  gateway/service_link.py;
* a call to one of a service's hot routes in this process is handed the identity object itself,
  in its ASGI scope: nothing crosses a socket or the app, so there is nothing to sign
  (gateway/direct_call.py).

On the service's side one function checks either (:func:`kit.service_app.require_identity`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol
from urllib.parse import quote

from kit.identity import Identity, sign


class ServiceCall:
    """What the service is sent: ``path`` decoded (as the service routes it and the signature
    covers it), ``query`` as it travelled to the gateway, ``headers`` unsigned, and ``target``, the
    path as it travels (:func:`wire_path`) with its query."""

    __slots__ = ("body", "headers", "identity", "method", "path", "query", "secret", "target")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes,
                 identity: Identity, secret: str):
        self.method, self.path, self.query, self.headers, self.body = method, path, query, headers, body
        self.identity = identity
        self.secret = secret
        """The key shared by the gateway and the services, for a transport that signs."""
        self.target = wire_path(path) + (f"?{query}" if query else "")

    def signed_headers(self) -> dict[str, str]:
        """``headers`` with the identity's signature over the method, the decoded path, the query
        and the body: what a service verifies on a call that reaches it across a boundary."""
        signed_target = self.path + (f"?{self.query}" if self.query else "")
        return {**self.headers, **sign(self.identity, self.secret, self.method, signed_target, self.body)}


class Upstream(Protocol):
    """A service's response as the gateway reads it: an :class:`httpx.Response`, or an answer read
    straight from a hot route's handler (:mod:`gateway.direct_call`)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class ServiceTransport(Protocol):
    """How one service is reached. ``send`` returns the response with its body unread (the caller
    reads and closes it) and raises :class:`httpx.HTTPError` when the service cannot be reached."""

    async def send(self, call: ServiceCall) -> Upstream: ...


def wire_path(path: str) -> str:
    """A (decoded) path as it travels to a service: what a URL cannot carry as it is (``?``, ``#``,
    ``%``, control characters, non-ASCII) percent-encoded and dot segments kept from being resolved,
    so the service routes and verifies exactly the path that was signed: an odd id is looked up
    and not found, never a broken URL (a 500), a truncated path or another route."""
    segments = (quote(s, safe="!$&'()*+,;=:@") for s in path.split("/"))
    return "/".join(s.replace(".", "%2E") if s in (".", "..") else s for s in segments)
