"""How the gateway reaches one service: the in-process app (embedded mode) or its URL
(distributed mode), through one httpx transport.

Proxied calls (:func:`gateway.proxy.forward`) hand their request straight to the transport. The
client's own ``send`` is made for callers of the open web: it merges a base URL, follows redirects,
runs auth flows and keeps a cookie jar, and on this path all of it was ~0.15-0.2 ms of a call's
CPU (0.30-0.37 ms against 0.16 ms per call to an in-process app, measured side by side), most
of it in building the request and in ``extract_cookies``. None of it applies to a signed call
to the gym's own service, and the cookie jar should not: one shared client would have replayed
a cookie set in answer to one key's call on every other key's calls. The client stays for the
operator's calls (audits, scoring), which are few.

The transport is also why a proxied call never reaches an HTTP proxy named in the environment:
it is the direct one, whatever ``HTTP_PROXY`` says (kit/no_proxy.py keeps the client's
own calls off proxies too).

In embedded mode a call to one of a service's hot routes does not take the transport at all: it is
handed to that route's handler in process (gateway/direct_call.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import httpx

from gateway.direct_call import DirectService
from kit.identity import Identity


class Upstream(Protocol):
    """A service's response as the gateway reads it: an :class:`httpx.Response`, or a
    :class:`gateway.direct_call.DirectResponse` for a hot route's answer in process."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class ServiceLink:
    def __init__(self, base_url: str, transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout,
                 direct: DirectService | None = None):
        self.base = httpx.URL(base_url)
        self.direct = direct
        self.transport = transport
        self.client = httpx.AsyncClient(transport=transport, base_url=base_url, timeout=timeout)
        self._extensions: dict[str, Any] = {"timeout": timeout.as_dict()}
        """What the client would give each request: its timeouts, read by the transport."""

    def in_process(self, method: str, target: str, path: str) -> bool:
        """Whether :meth:`send` takes this call to a hot route in process (embedded mode)."""
        return self.direct is not None and self.direct.handler(method, target, path) is not None

    async def send(self, method: str, target: str, headers: dict[str, str], content: bytes,
                   path: str | None = None, identity: Identity | None = None) -> Upstream:
        """One request to the service, its response streamed (the caller reads and closes it).
        ``target``: the path as it travels (already percent-encoded) with its query; ``path``: the
        same path decoded, when the caller knows it (a hot route is then taken in process, and
        handed ``identity`` as it is when one is given: see :meth:`in_process`). A call that takes
        the transport must carry signed ``headers``. Raises :class:`httpx.HTTPError` when the
        service cannot be reached."""
        if self.direct is not None and path is not None:
            handler = self.direct.handler(method, target, path)
            if handler is not None:
                answer: Upstream = await self.direct.call(handler, method, target, headers, content, identity)
                return answer
        try:
            url = self.base.copy_with(raw_path=target.encode("ascii"))
        except UnicodeEncodeError:  # a query as the caller sent it: encoded as the client's own merge does
            url = self.base.join(target)
        request = httpx.Request(method, url, headers=headers, content=content, extensions=self._extensions)
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    async def aclose(self) -> None:
        await self.client.aclose()  # closes the transport too
