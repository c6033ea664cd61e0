"""The in-sandbox agent's protocol, spoken to directly (no bubblewrap, no service): what the
sandbox service and every envd call rely on — event order, stdin, several readers of one
process, a reader that leaves mid-flood, refusals — on each interpreter a template may run."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.sandbox.backends.local import AGENT_SOURCE
from tests.fakes.servers import free_port

INTERPRETERS = [sys.executable] + [p for p in ("/usr/bin/python3",) if Path(p).exists()]


class Agent:
    def __init__(self, path: str):
        self.path = path

    def connect(self, request: dict[str, Any]) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(20)
        sock.connect(self.path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        return sock

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.connect(request) as sock, sock.makefile("rb") as f:
            return json.loads(f.readline())

    def events(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        with self.connect(request) as sock, sock.makefile("rb") as f:
            return [json.loads(line) for line in f]


def output(events: list[dict[str, Any]], name: str = "stdout") -> bytes:
    return b"".join(base64.b64decode(e[name]) for e in events if name in e)


@pytest.fixture(params=INTERPRETERS)
def start_agent(request: pytest.FixtureRequest) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []
    home = Path(tempfile.mkdtemp(prefix="rsigym-agent-"))

    def start(*extra: str) -> Agent:
        sock = home / f"agent{len(started)}.sock"
        env_file = home / "env.json"
        env_file.write_text(json.dumps({"HOME": str(home), "PATH": "/usr/bin:/bin"}))
        p = subprocess.Popen([request.param, "-I", "-S", str(AGENT_SOURCE), "--socket", str(sock),
                              "--env-file", str(env_file), *extra], stdout=subprocess.PIPE)
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        return Agent(str(sock))

    yield start
    for p in started:
        p.kill()
        p.wait()
    shutil.rmtree(home, ignore_errors=True)


def test_a_process_streams_start_output_and_end_in_order(start_agent: Any) -> None:
    agent = start_agent()
    events = agent.events({"op": "start", "cmd": "/bin/sh", "args": ["-c", "echo out; echo err >&2; exit 3"]})
    assert "start" in events[0] and events[0]["start"]["pid"] > 0
    assert events[-1] == {"end": {"exit_code": 3, "status": "exit status 3"}}
    assert output(events) == b"out\n" and output(events, "stderr") == b"err\n"
    killed = agent.events({"op": "start", "cmd": "/bin/sh", "args": ["-c", "kill -9 $$"]})
    assert killed[-1] == {"end": {"exit_code": -9, "status": "signal: kill"}}
    missing = agent.call({"op": "start", "cmd": "/no/such/program"})
    assert missing["error"]["code"] == "not_found"
    assert agent.call({"op": "list"}) == {"processes": []}  # ended processes are gone


def test_stdin_reaches_the_process_and_closing_it_ends_cat(start_agent: Any) -> None:
    agent = start_agent()
    with agent.connect({"op": "start", "cmd": "/bin/cat", "stdin": True}) as sock, sock.makefile("rb") as f:
        pid = json.loads(f.readline())["start"]["pid"]
        assert agent.call({"op": "input", "pid": pid, "data": base64.b64encode(b"hello\n").decode()}) == {"ok": True}
        assert json.loads(f.readline()) == {"stdout": base64.b64encode(b"hello\n").decode()}
        assert agent.call({"op": "close_stdin", "pid": pid}) == {"ok": True}
        again = agent.call({"op": "input", "pid": pid, "data": "eA=="})
        assert again.get("error", {}).get("code") in ("failed_precondition", "not_found")
        assert json.loads(f.readline())["end"]["exit_code"] == 0
    plain = agent.events({"op": "start", "cmd": "/bin/sleep", "args": ["0.3"]})
    assert plain[-1]["end"]["exit_code"] == 0


def test_a_second_reader_sees_the_rest_and_the_end(start_agent: Any) -> None:
    agent = start_agent()
    with agent.connect({"op": "start", "cmd": "/bin/sh", "args": ["-c", "sleep 0.5; echo late"]}) as first, \
            first.makefile("rb") as f:
        pid = json.loads(f.readline())["start"]["pid"]
        assert agent.call({"op": "list"})["processes"][0]["pid"] == pid
        second = agent.events({"op": "connect", "pid": pid})
        assert second[0] == {"start": {"pid": pid}} and output(second) == b"late\n"
        assert second[-1]["end"]["exit_code"] == 0
        assert [json.loads(line) for line in f][-1]["end"]["exit_code"] == 0
    assert agent.call({"op": "connect", "pid": pid})["error"]["code"] == "not_found"
    assert agent.call({"op": "signal", "pid": pid, "signal": 9})["error"]["code"] == "not_found"


def test_a_reader_that_leaves_a_flood_holds_nothing_up(start_agent: Any) -> None:
    """The flood's output fills the leaver's queue; the process must still run to its end and the
    agent serve everyone else meanwhile."""
    agent = start_agent()
    with agent.connect({"op": "start", "cmd": "/bin/sh", "args": ["-c", "head -c 20000000 /dev/zero; sleep 0.2"]}) as s, \
            s.makefile("rb") as f:
        pid = json.loads(f.readline())["start"]["pid"]
        assert "stdout" in json.loads(f.readline())
    assert agent.call({"op": "ping"})["ok"] is True
    deadline = time.monotonic() + 20
    while agent.call({"op": "list"})["processes"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert agent.call({"op": "list"}) == {"processes": []}, f"process {pid} never ended"


def test_refusals_answer_in_the_error_shape(start_agent: Any) -> None:
    agent = start_agent()
    for line in (b"not json\n", b"[1, 2]\n", b'{"op": "start"}\n'):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(agent.path)
            sock.sendall(line)
            answer = json.loads(sock.makefile("rb").readline())
        assert answer["error"]["code"] == "invalid_argument", line
    no_stdin = agent.connect({"op": "start", "cmd": "/bin/sleep", "args": ["5"]})
    pid = json.loads(no_stdin.makefile("rb").readline())["start"]["pid"]
    assert agent.call({"op": "input", "pid": pid, "data": "eA=="})["error"]["code"] == "failed_precondition"
    assert agent.call({"op": "signal", "pid": pid, "signal": 9}) == {"ok": True}
    no_stdin.close()
    assert agent.call({"op": "connect", "pid": 999_999})["error"]["code"] == "not_found"
    assert agent.call({"op": "stat", "path": "/no/such"})["error"]["code"] == "not_found"


def test_a_pool_agent_serves_only_ping_until_one_configure(start_agent: Any) -> None:
    agent = start_agent("--await-configure")
    assert agent.call({"op": "ping"})["ok"] is True
    assert agent.call({"op": "start", "cmd": "/bin/true"})["error"]["code"] == "failed_precondition"
    assert agent.call({"op": "configure", "env": {"MARK": "claimed"}}) == {"ok": True}
    events = agent.events({"op": "start", "cmd": "/bin/sh", "args": ["-c", "echo $MARK"]})
    assert output(events) == b"claimed\n"
    assert agent.call({"op": "configure", "env": {"MARK": "again"}})["error"]["code"] == "failed_precondition"


def test_the_door_forward_relays_both_ways(start_agent: Any, tmp_path: Path) -> None:
    door = str(tmp_path / "door.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(door)
    server.listen(4)

    def echo_upper() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                data += conn.recv(1024)
            conn.sendall(data.upper())

    threading.Thread(target=echo_upper, daemon=True).start()
    port = free_port()
    start_agent("--forward", f"127.0.0.1:{port}={door}")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"through the door\n")
        got = b""
        while chunk := client.recv(1024):
            got += chunk
    assert got == b"THROUGH THE DOOR\n"
    server.close()
    os.unlink(door)


def test_mkdirs_makes_each_with_its_parents_and_mode_and_names_what_it_made(start_agent: Any, tmp_path: Path) -> None:
    """The create's ``rsigymDirs``: ``mkdir -p`` then ``chmod`` of each, in order, without a
    program; the answer names every directory made, parents first, and none that was there."""
    agent = start_agent()
    (tmp_path / "there").mkdir(mode=0o700)
    base = str(tmp_path)
    answer = agent.call({"op": "mkdirs", "dirs": [[f"{base}/logs/verifier", 0o777], [f"{base}/logs/agent", 0o777],
                                                  [f"{base}/there", 0o755], [f"{base}/app", None]]})
    assert answer == {"made": [f"{base}/logs", f"{base}/logs/verifier", f"{base}/logs/agent", f"{base}/app"]}
    modes = {name: os.stat(tmp_path / name).st_mode & 0o777 for name in ("logs/verifier", "logs/agent", "there")}
    assert modes == {"logs/verifier": 0o777, "logs/agent": 0o777, "there": 0o755}
    assert (tmp_path / "app").is_dir() and not any((tmp_path / "app").iterdir())


def test_mkdirs_refuses_what_is_not_a_plain_directory_to_make(start_agent: Any, tmp_path: Path) -> None:
    """A path that is not normal, a mode beyond 0o777 and a file in the way are refused in the
    error shape; the directories named before the failure stay made, as a shell's would."""
    agent = start_agent()
    (tmp_path / "file").write_text("x")
    base = str(tmp_path)
    for bad in ([f"{base}/a/../../etc", None], ["relative", None], [f"{base}/ok", 0o4777]):
        answer = agent.call({"op": "mkdirs", "dirs": [bad]})
        assert answer["error"]["code"] == "invalid_argument", (bad, answer)
    answer = agent.call({"op": "mkdirs", "dirs": [[f"{base}/first", None], [f"{base}/file/under", None],
                                                  [f"{base}/never", None]]})
    assert answer["error"]["code"] == "invalid_argument" and "file/under" in answer["error"]["message"]
    assert (tmp_path / "first").is_dir() and not (tmp_path / "never").exists() and not (tmp_path / "ok").exists()
    assert agent.call({"op": "mkdirs", "dirs": [[f"{base}/file", None]]})["error"]["code"] == "already_exists"
