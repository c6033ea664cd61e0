"""The floor under any gateway on the gym's stack: a pass-through that does nothing but relay.

Served as the gym serves (uvicorn, the gym's HTTP protocol and its options), it takes each
``POST /v1/chat/completions``, puts the provider's key on it (the one thing any proxy must do),
sends it to the upstream on the gym's provider client (services/rollout/backends/http1.py: pooled
keep-alive connections), and relays the answer as it arrives (status,
content type, body chunk by chunk): no authentication, no
policy, no ledger, no metering, no logs. What it adds over a direct call is what the server and
client stack alone add on this box — the part of the gym's added latency no work of the gym's
can remove.

    python bench/_passthrough.py PORT UPSTREAM_URL KEY_ENV
"""

from __future__ import annotations

import os
import sys
from typing import Any

import uvicorn
from starlette.requests import Request

from kit.body_limits import server_options
from kit.config import GymConfig
from services.rollout.backends.http1 import Http1Pool


class PassThrough:
    def __init__(self, upstream: str, key: str):
        self.url = upstream.rstrip("/") + "/v1/chat/completions"
        self.key = key
        self.pool: Http1Pool | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self.pool is not None:
                await self.pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await Request(scope, receive).body()
        if self.pool is None:
            self.pool = Http1Pool(connect_s=10, read_s=60)
        headers = {"authorization": f"Bearer {self.key}", "content-type": "application/json"}
        upstream = await self.pool.post(self.url, body, headers)
        try:
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": [(b"content-type", (upstream.header("content-type") or "").encode())]})
            async for chunk in upstream.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            upstream.release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def main() -> None:
    port, upstream, key_env = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    uvicorn.run(PassThrough(upstream, os.environ[key_env]), host="127.0.0.1", port=port, log_level="warning",
                access_log=False, **server_options(GymConfig()))


if __name__ == "__main__":
    main()
