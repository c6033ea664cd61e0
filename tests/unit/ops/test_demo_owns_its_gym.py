"""`rsigym demo` owns its gym: with another gym on its port (the README's own `rsigym up` on 8700)
it takes a free port and says so, it counts a gym up only when that gym answers the token in the
demo's own data dir, and it removes the data dir it made when it ends, passed or failed.

The demo itself takes minutes (tests/e2e/test_demo.py); here its set-up, with a stand-in for the
gym process."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ops import demo_agent, demo_common
from ops.demo_common import background_process, own_gym, pick_port
from tests.fakes.servers import free_port


class _OtherGym(BaseHTTPRequestHandler):
    """Another gym: healthy, and refusing every admin token but its own."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        self.send_response(200 if self.path == "/healthz" else 401)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def _other_gym() -> Iterator[int]:
    _OtherGym.seen.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherGym)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


FAKE_GYM = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
data, port = Path(sys.argv[1]), int(sys.argv[2])
(data / "admin-token").write_text("rsa-ours\\n")
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        ours = self.headers.get("Authorization") == "Bearer rsa-ours"
        self.send_response(200 if self.path == "/healthz" or ours else 401)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", port), H).serve_forever()  # OSError (exit 1) when the port is taken, as `rsigym up`
"""


def _start(data: Path, port: int) -> Any:
    args = [sys.executable, "-c", FAKE_GYM, str(data), str(port)]
    url = f"http://127.0.0.1:{port}"
    return background_process(args, {}, f"{url}/healthz", data / "gym.log", start_timeout=20, ready=own_gym(url, data))


def test_a_busy_port_moves_the_demo_to_a_free_one_where_its_own_gym_answers(tmp_path: Path) -> None:
    with _other_gym() as busy:
        port = pick_port(busy)
        assert port != busy
        with _start(tmp_path, port) as proc:
            assert proc.poll() is None
    assert proc.poll() is not None  # stopped with the block


def test_another_gym_on_the_port_is_never_taken_for_the_demos_own(tmp_path: Path) -> None:
    """Its /healthz answers 200, as the old readiness check wanted; the demo's gym cannot bind and
    exits: the demo stops there, with its gym's log, instead of going on against the other gym."""
    with _other_gym() as busy:
        with pytest.raises(SystemExit, match="did not start"):
            with _start(tmp_path, busy):
                pytest.fail("the demo went on against a gym it did not start")
    assert set(_OtherGym.seen) <= {"/admin/v1/keys"}, "the demo asked the other gym anything but whether it is its own"


@pytest.mark.parametrize("outcome", ["passed", "failed"])
def test_the_demo_removes_the_data_dir_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str) -> None:
    made: list[tuple[Path, int]] = []

    def demo(agent: str, data: Path, port: int, *_: Any) -> int:
        assert data.is_dir()
        made.append((data, port))
        if outcome == "failed":
            raise SystemExit("the gym did not start")
        return 0

    monkeypatch.setattr(demo_agent, "_run_agent_demo", demo)
    monkeypatch.setattr(demo_common.tempfile, "tempdir", str(tmp_path))
    with _other_gym() as busy:
        if outcome == "failed":
            with pytest.raises(SystemExit):
                demo_agent.run_agent_demo("baseline", port=busy)
        else:
            assert demo_agent.run_agent_demo("baseline", port=busy) == 0
    (data, port), = made
    assert port != busy and data.parent == tmp_path
    assert not data.exists()


def test_a_data_dir_the_operator_named_or_asked_to_keep_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Path] = []
    monkeypatch.setattr(demo_agent, "_run_agent_demo", lambda _agent, data, *_: made.append(data) or 0)
    monkeypatch.setattr(demo_common.tempfile, "tempdir", str(tmp_path))
    assert demo_agent.run_agent_demo("baseline", data_dir=tmp_path / "mine", port=free_port()) == 0
    assert demo_agent.run_agent_demo("baseline", port=free_port(), keep=True) == 0
    assert made[0] == tmp_path / "mine" and all(d.is_dir() for d in made)
