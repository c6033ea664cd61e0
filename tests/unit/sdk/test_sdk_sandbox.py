"""The SDK's native sandbox surface (``gym.sandbox``) and ``gym sandbox …`` against a real
embedded gym served on loopback: local bubblewrap sandboxes, the real gateway, no e2b package."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from rsigym import APITimeoutError, AsyncGym, Gym, NotFoundError, RateLimitError, cli
from rsigym.resources.sandbox import CommandOutput, EnvelopeDecoder, Sandbox, envelope
from tests.conftest import create_key
from tests.fakes.servers import serve_gym

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture
def served(gym: Any) -> Iterator[str]:
    with serve_gym(gym) as url:
        yield url


@pytest.fixture
def new_key(served: str) -> Callable[..., str]:
    def make(**extra: Any) -> str:
        with httpx.Client(base_url=served) as c:
            return create_key(c, **extra)["key"]

    return make


@pytest.fixture
def client(served: str, new_key: Callable[..., str]) -> Iterator[Gym]:
    with Gym(base_url=served, api_key=new_key(), max_retries=0) as gym:
        yield gym


# ---- against a served gym ---------------------------------------------------------------------


@needs_bwrap
def test_run_streams_output_to_callbacks_and_returns_nonzero_exit(client: Gym) -> None:
    with client.sandbox.create(timeout=120, metadata={"purpose": "test"}, envs={"GREETING": "hi"}) as sbx:
        assert sbx.id.startswith("sbx_") and sbx.template == "base"
        seen: list[str] = []

        def on_stdout(text: str) -> None:
            seen.append(text)
            if "ready" in text:  # answered while the command still runs: the output is streamed
                sbx.files.write("go", "")

        result = sbx.run(
            "echo $GREETING; echo ready; for i in $(seq 200); do [ -f go ] && break; sleep 0.05; done; "
            "[ -f go ] && echo got-it || echo no-go; echo oops >&2; exit 3",
            on_stdout=on_stdout, on_stderr=seen.append,
        )
        assert result.exit_code == 3 and not result.ok
        assert result.stdout.splitlines() == ["hi", "ready", "got-it"]
        assert result.stderr == "oops\n"
        assert "".join(seen).count("oops") == 1 and "got-it" in "".join(seen)

        ok = sbx.run("pwd; echo $A", envs={"A": "b c"}, cwd="/tmp")
        assert (ok.exit_code, ok.stdout) == (0, "/tmp\nb c\n")
        assert sbx.run("printf 'caf\\xc3'; printf '\\xa9'").stdout == "café"  # a character split across reads


@needs_bwrap
def test_files_round_trip(client: Gym) -> None:
    with client.sandbox.create() as sbx:
        written = sbx.files.write("/home/user/notes/hello.txt", "hello sandbox")
        assert (written.name, written.type, written.path) == ("hello.txt", "file", "/home/user/notes/hello.txt")
        assert sbx.files.read("/home/user/notes/hello.txt") == "hello sandbox"
        sbx.files.write("notes/raw.bin", b"\x00\xff")  # relative paths are under /home/user
        assert sbx.files.read("/home/user/notes/raw.bin", text=False) == b"\x00\xff"

        entries = sbx.files.list("/home/user/notes")
        assert [(e.name, e.type, e.size) for e in entries] == [("hello.txt", "file", 13), ("raw.bin", "file", 2)]
        assert entries[0].modified_time is not None and entries[0].permissions == "-rw-r--r--"
        assert [e.path for e in sbx.files.list(depth=2)] == [
            "/home/user/notes", "/home/user/notes/hello.txt", "/home/user/notes/raw.bin",
        ]
        assert [e.path for e in sbx.files.list()] == ["/home/user/notes"]
        assert sbx.files.exists("/home/user/notes/hello.txt")
        assert not sbx.files.exists("/home/user/missing")
        assert sbx.files.make_dir("/home/user/d2/sub") is True
        assert sbx.files.make_dir("/home/user/d2/sub") is False
        assert sbx.files.stat("/home/user/d2").type == "dir"
        moved = sbx.files.rename("/home/user/notes/raw.bin", "/home/user/d2/raw.bin")
        assert moved.path == "/home/user/d2/raw.bin"
        sbx.files.remove("/home/user/notes/hello.txt")
        assert not sbx.files.exists("/home/user/notes/hello.txt")
        with pytest.raises(NotFoundError):
            sbx.files.remove("/home/user/notes/hello.txt")
        with pytest.raises(NotFoundError):
            sbx.files.read("/home/user/notes/hello.txt")
        assert sbx.run("cat /home/user/d2/raw.bin | wc -c").stdout.strip() == "2"


@needs_bwrap
def test_info_shows_state_and_cost_after_kill(client: Gym) -> None:
    sbx = client.sandbox.create(timeout=60, metadata={"who": "me"})
    record = sbx.info()
    assert (record.state, record.running, record.metadata, record.template) == ("running", True, {"who": "me"}, "base")
    assert record.usd_per_hour and record.usd_per_hour > 0
    assert [r.id for r in client.sandbox.list(state="running")] == [sbx.id]
    sbx.set_timeout(30)
    assert sbx.is_running()
    time.sleep(0.3)
    assert sbx.kill() is True
    assert sbx.kill() is False  # already ended: not an error
    record = client.sandbox.get(sbx.id)
    assert (record.state, record.end_reason, record.running) == ("killed", "killed by its owner", False)
    assert record.seconds > 0 and record.cost_usd > 0 and record.ended_at is not None
    assert client.sandbox.list(state="running") == []
    assert [r.id for r in client.sandbox.list()] == [sbx.id]
    with pytest.raises(NotFoundError, match="ended"):
        sbx.run("true")
    with pytest.raises(NotFoundError):
        sbx.files.read("/etc/hostname")


@needs_bwrap
def test_context_manager_kills_even_on_error(client: Gym) -> None:
    with client.sandbox.create() as sbx:
        assert sbx.run("true").exit_code == 0
    assert client.sandbox.get(sbx.id).state == "killed"
    with pytest.raises(RuntimeError), client.sandbox.create() as other:
        raise RuntimeError("boom")
    assert client.sandbox.get(other.id).state == "killed"


@needs_bwrap
def test_unknown_or_foreign_ids_are_not_found(client: Gym, served: str, new_key: Callable[..., str]) -> None:
    with pytest.raises(NotFoundError) as missing:
        client.sandbox.get("sbx_does_not_exist")
    assert missing.value.status_code == 404 and missing.value.request_id
    with pytest.raises(NotFoundError):
        client.sandbox.connect("sbx_does_not_exist")
    with pytest.raises(NotFoundError):  # inside the command stream's trailer
        Sandbox(client, "sbx_does_not_exist").run("true")
    with pytest.raises(NotFoundError):
        Sandbox(client, "sbx_does_not_exist").files.list("/")
    assert client.sandbox.kill("sbx_does_not_exist") is False
    with client.sandbox.create() as sbx, Gym(base_url=served, api_key=new_key()) as other:
        with pytest.raises(NotFoundError):
            other.sandbox.get(sbx.id)
        with pytest.raises(NotFoundError):
            Sandbox(other, sbx.id).files.read("/etc/hostname")
        assert other.sandbox.kill(sbx.id) is False
        assert sbx.is_running()


@needs_bwrap
def test_live_sandbox_cap_is_a_rate_limit(client: Gym, served: str) -> None:
    child = client.keys.mint(name="one-sandbox", policy={"services": {"sandbox": {"max_concurrency": 1}}})
    assert child.key
    with Gym(base_url=served, api_key=child.key, max_retries=0) as gym, gym.sandbox.create():
        with pytest.raises(RateLimitError):
            gym.sandbox.create()


@needs_bwrap
def test_run_timeout_kills_the_command(client: Gym) -> None:
    with client.sandbox.create() as sbx:
        started = time.monotonic()
        with pytest.raises(APITimeoutError, match="killed"):
            sbx.run("echo begun; sleep 1; touch late", timeout=0.5)
        assert time.monotonic() - started < 1
        time.sleep(1.2)
        assert not sbx.files.exists("late")
        assert sbx.run("echo still usable").stdout == "still usable\n"


@needs_bwrap
def test_a_sandbox_ending_under_a_command_ends_the_run(client: Gym) -> None:
    sbx = client.sandbox.create()
    killer = threading.Timer(0.3, sbx.kill)
    killer.start()
    started = time.monotonic()
    result = sbx.run("echo a; sleep 30; echo b")
    killer.join()
    assert time.monotonic() - started < 10
    assert (result.stdout, result.exit_code, result.status) == ("a\n", -1, "sandbox ended")
    assert sbx.info().state == "killed"


@needs_bwrap
def test_async_twin(served: str, new_key: Callable[..., str]) -> None:
    async def main() -> tuple[str, str]:
        async with AsyncGym(base_url=served, api_key=new_key()) as gym:
            async with await gym.sandbox.create(timeout=60) as sbx:
                chunks: list[str] = []
                result = await sbx.run("echo a; echo b >&2; exit 4", on_stdout=chunks.append)
                assert (result.exit_code, result.stdout, result.stderr, "".join(chunks)) == (4, "a\n", "b\n", "a\n")
                await sbx.files.write("x.txt", "async")
                assert await sbx.files.read("/home/user/x.txt") == "async"
                assert [e.name for e in await sbx.files.list()] == ["x.txt"]
                assert await sbx.files.exists("x.txt") and not await sbx.files.exists("y.txt")
                assert [r.id for r in await gym.sandbox.list(state="running")] == [sbx.id]
            record = await gym.sandbox.get(sbx.id)
            with pytest.raises(NotFoundError):
                await gym.sandbox.get("sbx_nope")
            return sbx.id, record.state

    _, state = asyncio.run(main())
    assert state == "killed"


@needs_bwrap
def test_cli_sandbox_commands(served: str, new_key: Callable[..., str], capsys: pytest.CaptureFixture[str]) -> None:
    key = new_key()

    def gym(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv), client_factory=lambda: Gym(base_url=served, api_key=key))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = gym("sandbox", "create", "--timeout", "120")
    sandbox_id = out.strip()
    assert code == 0 and sandbox_id.startswith("sbx_") and "kill" in err

    assert gym("sandbox", "run", sandbox_id, "--", "echo out; echo err >&2; exit 7") == (7, "out\n", "err\n")
    assert gym("sandbox", "run", sandbox_id, "--env", "X=1 2", "--cwd", "/tmp", "--", 'echo "$X"; pwd') == (
        0, "1 2\n/tmp\n", "")
    code, out, _ = gym("sandbox", "run", sandbox_id, "--", "printf", "%s|", "$HOME", "a b")
    assert (code, out) == (0, "$HOME|a b|")  # several words stay words, unexpanded
    code, _, err = gym("sandbox", "run", sandbox_id, "--timeout", "0.3", "--", "sleep 5")
    assert code == 124 and "timeout" in err
    assert gym("sandbox", "run", sandbox_id, "--", "kill -9 $$")[0] == 137

    code, out, _ = gym("sandbox", "ls")
    assert code == 0 and out.splitlines()[0].split() == ["ID", "TEMPLATE", "STATE", "SECONDS", "COST", "STARTED"]
    assert out.splitlines()[1].split()[:3] == [sandbox_id, "base", "running"]
    code, out, _ = gym("sandbox", "info", sandbox_id, "--json")
    assert code == 0 and json.loads(out)["state"] == "running"

    assert gym("sandbox", "kill", sandbox_id) == (0, f"{sandbox_id}: killed\n", "")
    code, out, _ = gym("sandbox", "info", sandbox_id)
    assert code == 0 and "killed by its owner" in out and "cost" in out
    assert gym("sandbox", "ls") == (0, "no running sandboxes\n", "")
    assert json.loads(gym("sandbox", "ls", "--all", "--json")[1])[0]["state"] == "killed"

    code, _, err = gym("sandbox", "run", sandbox_id, "--", "true")
    assert code == 1 and err.startswith("error: not_found")
    code, _, err = gym("sandbox", "info", "sbx_nope")
    assert code == 1 and err.startswith("error: not_found")
    assert gym("sandbox", "run", sandbox_id)[0] == 2  # no command: a usage error


# ---- decoding, without a server -----------------------------------------------------------------


def _response() -> httpx.Response:
    return httpx.Response(200, request=httpx.Request("POST", "http://gym.test/sandbox/envd/process.Process/Start"))


def test_envelopes_split_anywhere_decode_the_same() -> None:
    import base64

    def data(name: str, raw: bytes) -> bytes:
        return envelope({"event": {"data": {name: base64.b64encode(raw).decode()}}})

    stream = (envelope({"event": {"start": {"pid": 7}}}) + data("stdout", "h\u00e9".encode()[:2])
              + data("stdout", "h\u00e9".encode()[2:]) + data("stderr", b"e")
              + envelope({"event": {"end": {"exitCode": 2, "exited": True, "status": "exit status 2"}}})
              + envelope({}, flags=0x02))
    for size in (1, 3, 7, len(stream)):
        seen: list[str] = []
        output = CommandOutput(seen.append, None)
        for i in range(0, len(stream), size):
            output.feed(stream[i:i + size], _response())
        result = output.result()
        assert (result.stdout, result.stderr, result.exit_code, result.pid) == ("h\u00e9", "e", 2, 7)
        assert "".join(seen) == "h\u00e9" and output.finished and not output.decoder.pending


def test_stream_trailer_errors_map_to_sdk_errors() -> None:
    from rsigym import APIConnectionError, BudgetExhaustedError, InternalServerError, PermissionDeniedError

    cases = {"not_found": NotFoundError, "permission_denied": PermissionDeniedError, "internal": InternalServerError,
             "unimplemented": InternalServerError}
    for code, cls in cases.items():
        with pytest.raises(cls) as raised:
            CommandOutput(None, None).feed(envelope({"error": {"code": code, "message": "m"}}, flags=0x02), _response())
        assert raised.value.type == code and raised.value.message == "m"
    with pytest.raises(BudgetExhaustedError):
        CommandOutput(None, None).feed(
            envelope({"error": {"code": "resource_exhausted", "message": "budget exhausted"}}, flags=2), _response())
    output = CommandOutput(None, None)
    output.feed(envelope({"event": {"start": {"pid": 1}}}), _response())
    with pytest.raises(APIConnectionError, match="ended before"):
        output.result()
    with pytest.raises(APIConnectionError, match="malformed"):
        EnvelopeDecoder().feed(b"\x00\x00\x00\x00\x02{x")
