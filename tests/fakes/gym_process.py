"""An embedded gym in its own process, served by uvicorn exactly as ``rsigym up`` serves it (same
server options), so tests and benchmarks can read its memory and its latency from outside; and
a raw HTTP/1.1 client that sends bodies the way an abusive client does (declared lengths it
never sends, endless chunked streams, one byte at a time).

    python -m tests.fakes.gym_process DATA_DIR CONFIG PORT     (what :func:`gym_process` runs)
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "rsa-test-admin-token"


@dataclass
class GymProcess:
    url: str
    port: int
    pid: int

    def key(self, budget: float = 5.0, track: str = "joint") -> str:
        r = httpx.post(self.url + "/admin/v1/keys", json={"track": track, "budget_usd": budget},
                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    def rss_bytes(self) -> int:
        return _status_kib(self.pid, "VmRSS") * 1024

    def peak_rss_bytes(self) -> int:
        return _status_kib(self.pid, "VmHWM") * 1024

    def reset_peak(self) -> bool:
        """Reset the peak RSS to the current RSS (Linux ``clear_refs`` 5); False where it cannot."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            return True
        except OSError:
            return False


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


@contextmanager
def gym_process(data_dir: Path, config_toml: str, *, startup_s: float = 180,
                env: dict[str, str | None] | None = None) -> Iterator[GymProcess]:
    """``env``: variables of the gym's process only, on top of this one's (None: unset there)."""
    from tests.fakes.servers import free_port

    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / "gym.toml"
    config.write_text(config_toml)
    port = free_port()
    own = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            own.pop(name, None)
        else:
            own[name] = value
    own.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "RSIGYM_ADMIN_TOKEN": ADMIN_TOKEN})
    log = open(data_dir / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.gym_process", str(data_dir), str(config), str(port)],
                            cwd=ROOT, env=own, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"gym process did not start: {(data_dir / 'server.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield GymProcess(url=url, port=port, pid=proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        log.close()


@dataclass
class Answer:
    status: int | None
    """None: the server closed the connection without an answer."""
    body: dict[str, Any] | None
    sent: int
    """Body bytes the client got to send before the answer came."""
    closed: bool
    """The server closed the connection after answering."""


def read_answer(sock: socket.socket, timeout: float,
                close_wait_s: float) -> tuple[int | None, dict[str, Any] | None, bool]:
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None, None, True
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        body = json.loads(rest[:length]) if length else None
        closed = False
        if close_wait_s > 0:
            try:
                sock.settimeout(close_wait_s)
                closed = sock.recv(1) == b""
            except ConnectionResetError:  # closed with bytes of ours unread: the kernel resets
                closed = True
            except (TimeoutError, OSError):
                closed = False
        return status, body, closed
    except (ConnectionError, TimeoutError):
        return None, None, True


def push(port: int, method: str, path: str, headers: dict[str, str], body: Iterator[bytes], *,
         chunked: bool, pause_s: float = 0.0, answer_timeout: float = 60.0, close_wait_s: float = 0.0) -> Answer:
    """Send a request head and then ``body``'s pieces (chunked, or raw under the caller's
    Content-Length) until the server answers; returns the answer and how much was sent.
    ``close_wait_s``: how long to wait, after the answer, for the server to close the connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
        if chunked:
            head.append("Transfer-Encoding: chunked")
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        sock.setblocking(False)
        for piece in body:
            frame = (f"{len(piece):x}\r\n".encode() + piece + b"\r\n") if chunked else piece
            view = memoryview(frame)
            while view:
                readable, writable, _ = select.select([sock], [sock], [], answer_timeout)
                if readable:
                    status, answer, closed = read_answer(sock, answer_timeout, close_wait_s)
                    return Answer(status, answer, sent, closed)
                if not writable:
                    return Answer(None, None, sent, False)
                try:
                    n = sock.send(view)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    status, answer, closed = read_answer(sock, answer_timeout, close_wait_s)
                    return Answer(status, answer, sent, closed)
                view = view[n:]
            sent += len(piece)
            if pause_s:
                time.sleep(pause_s)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
        status, answer, closed = read_answer(sock, answer_timeout, close_wait_s)
        return Answer(status, answer, sent, closed)
    finally:
        sock.close()


def repeat(piece: bytes, total: int) -> Iterator[bytes]:
    """``total`` bytes as pieces of ``piece``."""
    left = total
    while left > 0:
        yield piece[:left]
        left -= len(piece)


def _main() -> None:
    import uvicorn

    from kit.body_limits import server_options
    from kit.heap import prepare_heap
    from kit.settings import GymSettings
    from ops.builder import build_embedded

    data_dir, config, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    settings = GymSettings(data_dir=data_dir, config=config, admin_token=ADMIN_TOKEN)
    gym = build_embedded(settings)
    gym.listening_at(f"http://127.0.0.1:{port}")
    prepare_heap()  # as `rsigym up` does
    uvicorn.run(gym.app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                **server_options(gym.gateway.config))


if __name__ == "__main__":
    _main()
