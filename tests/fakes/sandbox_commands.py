"""Running a command in a local backend's sandbox directly (no gateway, no service), for tests of
the backend itself."""

from __future__ import annotations

import asyncio
import base64

from services.sandbox.backends.local import LocalBackend


def run_in_sandbox(backend: LocalBackend, sandbox_id: str, cmd: str) -> str:
    """``bash -c cmd`` in the sandbox, to its end; its stdout."""

    async def go() -> str:
        out = b""
        async for ev in backend.stream(sandbox_id, {"op": "start", "cmd": "/bin/bash", "args": ["-c", cmd]}):
            out += base64.b64decode(ev.get("stdout", ""))
        return out.decode()

    return asyncio.run(go())
