"""The gym's calls to itself never go through a proxy that the environment names.

An operator sets ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` for egress to model providers,
and the rollout pass-through honours them. But every HTTP client in the gym's processes reads
the same variables: httpx, the e2b SDK's transport (reqwest), aiohttp and urllib. So without more,
the gym's calls to itself would go to that proxy too. Those calls are:

* evaluation trials and a sandbox's model door calling the gateway;
* the gateway calling its services (distributed mode);
* the audit judge;
* a local vLLM server.

Each such call then fails, since the proxy's 127.0.0.1 is not ours. And it hands the proxy, in
clear, the run and sandbox keys and the signed identities it carries.

Adding the gym's own hosts to ``NO_PROXY`` fixes every client at once, including the e2b SDK,
which has no option of its own for it. The own hosts are loopback and the hosts of the gateway
and service URLs. ``no_proxy`` is set too, since libraries differ on which of the two they read.
This happens once, before the process builds its clients; provider hosts stay on the proxy.
"""

from __future__ import annotations

import os

import httpx

LOOPBACK = ("localhost", "127.0.0.1", "::1")
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
"""What names a proxy (and each one's lower-case spelling)."""


def keep_off_proxies(*urls: str | None) -> list[str]:
    """Add loopback and the hosts of ``urls`` to ``NO_PROXY`` and ``no_proxy`` (kept in the order
    found, merged, with nothing removed), when the environment names any proxy. Returns the
    hosts that are now kept off it (empty when no proxy is named)."""
    if not any(os.environ.get(name) or os.environ.get(name.lower()) for name in PROXY_VARIABLES):
        return []
    entries: list[str] = []
    for name in ("NO_PROXY", "no_proxy"):
        for entry in os.environ.get(name, "").split(","):
            if entry.strip() and entry.strip() not in entries:
                entries.append(entry.strip())
    for host in (*LOOPBACK, *(httpx.URL(url).host for url in urls if url)):
        if host and host not in entries:
            entries.append(host)
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(entries)
    return entries
