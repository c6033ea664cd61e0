"""Real servers on loopback for tests: uvicorn in a thread, on a free port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(app: Any, port: int | None = None) -> Iterator[str]:
    """Serve an ASGI app on 127.0.0.1 until the block ends; yields its base URL."""
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@contextmanager
def serve_gym(gym: Any) -> Iterator[str]:
    """Serve an embedded gym as ``rsigym up`` does: it is told the address it listens at, which
    is where its evaluation trials and sandbox doors call back (never a request's Host)."""
    port = free_port()
    gym.listening_at(f"http://127.0.0.1:{port}")
    with serve(gym.app, port=port) as url:
        yield url


def wait_healthy(proc: Any, url: str, log: Any, timeout_s: float = 180) -> None:
    """Wait for a gym process's ``/healthz``; fail with the tail of its log if it exits or is late."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)
