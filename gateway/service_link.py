"""How the gateway reaches one service: its URL (distributed mode) or its app in this process
(embedded mode), through one httpx transport, and in embedded mode its hot routes in process.

Proxied calls (:func:`gateway.proxy.forward`) go through :attr:`ServiceLink.transport`, the seam of
gateway/service_call.py: a :class:`SignedTransport` on the httpx transport, with the service's hot
routes taken in process before it (:class:`gateway.direct_call.DirectTransport`) when the link is
given the service's app (``direct``).

A :class:`SignedTransport` hands its request straight to the httpx transport. The client's own
``send`` is made for callers of the open web: it merges a base URL, follows redirects, runs auth
flows and keeps a cookie jar, and on this path all of it was ~0.15-0.2 ms of a call's CPU (0.30-0.37
ms against 0.16 ms per call to an in-process app, measured side by side), most of it in building
the request and in ``extract_cookies``. None of it applies to a signed call to the gym's own
service, and the cookie jar should not: one shared client would have replayed a cookie set in
answer to one key's call on every other key's calls. The client stays for the operator's calls
(audits, scoring), which are few.

The transport is also why a proxied call never reaches an HTTP proxy named in the environment:
it is the direct one, whatever ``HTTP_PROXY`` says (kit/no_proxy.py keeps the client's
own calls off proxies too).
"""

from __future__ import annotations

from typing import Any

import httpx

from gateway.direct_call import DirectService, DirectTransport
from gateway.service_call import ServiceCall, ServiceTransport, Upstream


class SignedTransport:
    """The seam's implementation for a call that crosses a boundary (a socket, or the service's
    whole ASGI app in process): signed, sent as an :class:`httpx.Request` through ``transport``."""

    def __init__(self, base_url: str, transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout):
        self.base = httpx.URL(base_url)
        self.transport = transport
        self._extensions: dict[str, Any] = {"timeout": timeout.as_dict()}
        """What the client would give each request: its timeouts, read by the transport."""

    async def send(self, call: ServiceCall) -> httpx.Response:
        try:
            url = self.base.copy_with(raw_path=call.target.encode("ascii"))
        except UnicodeEncodeError:  # a query as the caller sent it: encoded as the client's own merge does
            url = self.base.join(call.target)
        request = httpx.Request(call.method, url, headers=call.signed_headers(), content=call.body,
                                extensions=self._extensions)
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response


class ServiceLink:
    """``transport``: the httpx transport to the service (its URL's, or its app's in process);
    ``direct``: the service's app in this process, whose hot routes are then taken in process."""

    def __init__(self, base_url: str, transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout,
                 direct: DirectService | None = None):
        self.client = httpx.AsyncClient(transport=transport, base_url=base_url, timeout=timeout)
        self.in_process = direct is not None
        """The service's app runs in this process (embedded mode): up while the gateway is."""
        signed = SignedTransport(base_url, transport, timeout)
        self.transport: ServiceTransport = signed if direct is None else DirectTransport(direct, signed)

    async def send(self, call: ServiceCall) -> Upstream:
        """One proxied call, its response streamed (the caller reads and closes it). Raises
        :class:`httpx.HTTPError` when the service cannot be reached."""
        return await self.transport.send(call)

    async def aclose(self) -> None:
        await self.client.aclose()  # closes the httpx transport too
