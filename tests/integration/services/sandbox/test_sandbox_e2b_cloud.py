"""The E2B cloud backend against a fake of E2B's control plane and sandbox daemon.

Backend level: every agent-protocol operation goes through the e2b SDK to the fake with the
platform's key; owner metadata is stamped and cannot be overridden; a sandbox without
internet gets E2B's no-internet network settings; a sandbox whose metadata names another
run or gym sandbox is refused and never killed. End to end: the agent's unmodified e2b SDK
talks to a served gym whose sandbox backend is E2B, and only the platform's key reaches E2B.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from kit.config import GymConfig, SandboxConfig, SandboxTemplate
from kit.errors import NotFound, ServiceUnavailable, Unprocessable
from kit.settings import GymSettings, ProviderSecrets
from kit.spec import ServiceContext
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.e2b_cloud import E2BCloudBackend
from tests.conftest import TEACHER_ENV, create_key, gym_config
from tests.fakes.fake_e2b import FakeE2BState, create_fake_e2b
from tests.fakes.servers import serve, serve_gym

PLATFORM_KEY = "e2b_platform_" + secrets.token_hex(16)
TEMPLATE = SandboxTemplate(name="base", e2b_template="rsigym-base")


@pytest.fixture
def fake_e2b(tmp_path: Path) -> Iterator[tuple[str, FakeE2BState]]:
    app = create_fake_e2b(PLATFORM_KEY, tmp_path / "e2b")
    with serve(app) as url:
        yield url, app.state
    app.close()


def sandbox_config(url: str, **extra: Any) -> dict[str, Any]:
    cfg = {"backend": "e2b", "e2b_api_url": url, "e2b_domain": "fake.e2b.test",
           "templates": [TEMPLATE.model_dump()], **extra}
    if "e2b_sandbox_url" in SandboxConfig.model_fields:
        cfg["e2b_sandbox_url"] = url
    return cfg


def with_sandbox_url(config: GymConfig, url: str) -> GymConfig:
    """Until SandboxConfig has the field, the daemon override is set on the instance."""
    if "e2b_sandbox_url" not in SandboxConfig.model_fields:
        object.__setattr__(config.sandbox, "e2b_sandbox_url", url)
    return config


def context(url: str, tmp_path: Path, key: str | None = PLATFORM_KEY) -> ServiceContext:
    config = with_sandbox_url(GymConfig.model_validate({"sandbox": sandbox_config(url)}), url)
    return ServiceContext(config=config, store=None, settings=GymSettings(data_dir=tmp_path),  # type: ignore[arg-type]
                          internal_secret="s", secrets=ProviderSecrets({"E2B_API_KEY": key} if key else {}))


@pytest.fixture
def make_backend(fake_e2b: tuple[str, FakeE2BState], tmp_path: Path) -> Iterator[Callable[..., E2BCloudBackend]]:
    built: list[E2BCloudBackend] = []

    def make(**tuning: Any) -> E2BCloudBackend:
        backend = E2BCloudBackend.from_context(context(fake_e2b[0], tmp_path))
        for name, value in tuning.items():
            setattr(backend, name, value)
        built.append(backend)
        return backend

    yield make
    for backend in built:
        backend.close()


def spec(sandbox_id: str = "sbx_gym1", owner: str = "run_a", **kw: Any) -> SandboxSpec:
    return SandboxSpec(sandbox_id, TEMPLATE, owner, **{"timeout_s": 120, **kw})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def collect(events: AsyncIterator[dict[str, Any]]) -> tuple[bytes, bytes, list[dict[str, Any]]]:
    out, err, rest = b"", b"", []
    async for event in events:
        if "stdout" in event:
            out += base64.b64decode(event["stdout"])
        elif "stderr" in event:
            err += base64.b64decode(event["stderr"])
        else:
            rest.append(event)
    return out, err, rest


# -- backend level ----------------------------------------------------------------------------


def test_create_stamps_owner_metadata_and_denies_internet(make_backend: Callable[..., E2BCloudBackend],
                                                         fake_e2b: tuple[str, FakeE2BState]) -> None:
    _, fake = fake_e2b
    backend = make_backend()
    agent_metadata = {"purpose": "t", "rsigym_run": "run_evil", "rsigym_sandbox": "sbx_other", "rsigym_x": "1"}
    ref = backend.create(spec(envs={"GREETING": "hi"}, metadata=agent_metadata))
    assert ref in fake.sandboxes and ref != "sbx_gym1"
    body = fake.creates[-1]
    assert body["templateID"] == "rsigym-base"
    assert body["timeout"] == 120
    assert body["envVars"] == {"GREETING": "hi"}
    assert body["metadata"] == {"purpose": "t", "rsigym_run": "run_a", "rsigym_sandbox": "sbx_gym1"}
    assert body["allow_internet_access"] is False
    assert body["network"] == {"denyOut": ["0.0.0.0/0"], "allowPublicTraffic": False}
    assert body["autoPause"] is False

    backend.create(spec("sbx_gym2", internet=True))
    body = fake.creates[-1]
    assert body["allow_internet_access"] is True
    assert body["network"] == {"allowPublicTraffic": False}  # egress open, ports still private
    backend.create(spec("sbx_gym3", timeout_s=86_400))
    assert fake.creates[-1]["timeout"] == backend.lease_s == 600  # the gym ends it; E2B gets one lease at a time
    assert fake.api_keys == {PLATFORM_KEY}


def test_make_dirs_is_one_command_that_names_what_it_made(make_backend: Callable[..., E2BCloudBackend],
                                                          fake_e2b: tuple[str, FakeE2BState], tmp_path: Path) -> None:
    """The create's ``rsigymDirs`` on E2B: one command makes each directory with its parents and
    its mode and names what it made; a directory under a file is refused as the local backend
    refuses it. (The fake runs commands on this host: the paths are this test's own.)"""
    _, fake = fake_e2b
    backend = make_backend()
    backend.create(spec())
    base = tmp_path / "made"
    (tmp_path / "file").write_text("x")
    made = backend.make_dirs("sbx_gym1", [(f"{base}/logs/verifier", 0o777), (f"{base}/app", None)])
    assert made == [str(base), f"{base}/logs", f"{base}/logs/verifier", f"{base}/app"]
    assert (base / "logs" / "verifier").stat().st_mode & 0o777 == 0o777 and (base / "app").is_dir()
    assert backend.make_dirs("sbx_gym1", [(f"{base}/app", 0o700)]) == []
    assert (base / "app").stat().st_mode & 0o777 == 0o700
    with pytest.raises(Unprocessable) as refused:
        backend.make_dirs("sbx_gym1", [(f"{tmp_path}/file/under", None)])
    assert refused.value.param == "rsigymDirs" and "Not a directory" in refused.value.message


def test_agent_protocol_round_trip_through_the_sdk(make_backend: Callable[..., E2BCloudBackend],
                                                   fake_e2b: tuple[str, FakeE2BState]) -> None:
    _, fake = fake_e2b
    backend = make_backend()
    ref = backend.create(spec(envs={"GREETING": "hi"}))
    sid = "sbx_gym1"

    async def drive() -> None:
        # a command as the agent's SDK sends it (bash -l -c LINE): streamed output, exit code
        out, err, rest = await collect(backend.stream(sid, {
            "op": "start", "cmd": "/bin/bash", "args": ["-l", "-c", "echo $GREETING; echo oops >&2; exit 3"]}))
        assert (out, err) == (b"hi\n", b"oops\n")
        assert "pid" in rest[0]["start"] and rest[-1]["end"]["exit_code"] == 3
        # any other command line runs exactly as given
        out, _, rest = await collect(backend.stream(sid, {"op": "start", "cmd": "printf", "args": ["%s|", "a b", "c"]}))
        assert out == b"a b|c|" and rest[-1]["end"]["exit_code"] == 0

        # stdin
        events = backend.stream(sid, {"op": "start", "cmd": "/bin/bash", "args": ["-l", "-c", "cat"], "stdin": True})
        pid = (await anext(events))["start"]["pid"]
        assert (await backend.call(sid, {"op": "input", "pid": pid, "data": b64(b"ping\n")})) == {"ok": True}
        assert (await backend.call(sid, {"op": "close_stdin", "pid": pid})) == {"ok": True}
        out, _, rest = await collect(events)
        assert out == b"ping\n" and rest[-1]["end"]["exit_code"] == 0

        # a background process: listed, then killed
        events = backend.stream(sid, {"op": "start", "cmd": "/bin/bash", "args": ["-l", "-c", "sleep 300"]})
        pid = (await anext(events))["start"]["pid"]
        listed = await backend.call(sid, {"op": "list"})
        assert pid in [p["pid"] for p in listed["processes"]]
        assert (await backend.call(sid, {"op": "signal", "pid": pid, "signal": 9})) == {"ok": True}
        _, _, rest = await collect(events)
        assert rest[-1]["end"]["exit_code"] != 0
        assert (await backend.call(sid, {"op": "signal", "pid": pid, "signal": 9}))["error"]["code"] == "not_found"
        missing = [e async for e in backend.stream(sid, {"op": "connect", "pid": pid})]
        assert missing[0]["error"]["code"] == "not_found"

        # files
        written = await backend.call(sid, {"op": "write", "path": "/home/user/notes/a.txt", "data": b64(b"hello")})
        entry = written["entry"]
        assert (entry["name"], entry["type"], entry["path"], entry["size"]) == ("a.txt", "file",
                                                                                 "/home/user/notes/a.txt", 5)
        assert isinstance(entry["modified_time"], float) and entry["permissions"].startswith("-")
        assert (await backend.call(sid, {"op": "read", "path": "/home/user/notes/a.txt"})) == {"data": b64(b"hello")}
        too_big = await backend.call(sid, {"op": "read", "path": "/home/user/notes/a.txt", "limit": 4})
        assert too_big["error"]["code"] == "resource_exhausted"
        assert (await backend.call(sid, {"op": "read", "path": "/home/user/notes"}))["error"]["code"] == \
            "invalid_argument"
        out, _, _ = await collect(backend.stream(sid, {"op": "start", "cmd": "/bin/bash",
                                                       "args": ["-l", "-c", "cat notes/a.txt"]}))
        assert out == b"hello"
        made = await backend.call(sid, {"op": "mkdir", "path": "/home/user/notes/sub"})
        assert made["created"] is True and made["entry"]["type"] == "directory"
        assert (await backend.call(sid, {"op": "mkdir", "path": "/home/user/notes/sub"}))["created"] is False
        listing = await backend.call(sid, {"op": "listdir", "path": "/home/user", "depth": 2})
        assert [e["path"] for e in listing["entries"]] == ["/home/user/notes", "/home/user/notes/sub",
                                                          "/home/user/notes/a.txt"]
        moved = await backend.call(sid, {"op": "rename", "path": "/home/user/notes/a.txt",
                                         "destination": "/home/user/b.txt"})
        assert moved["entry"]["path"] == "/home/user/b.txt"
        assert (await backend.call(sid, {"op": "stat", "path": "/home/user/b.txt"}))["entry"]["size"] == 5
        assert (await backend.call(sid, {"op": "remove", "path": "/home/user/b.txt"})) == {"ok": True}
        gone = await backend.call(sid, {"op": "stat", "path": "/home/user/b.txt"})
        assert gone["error"]["code"] == "not_found"
        assert ref not in gone["error"]["message"]  # E2B's id never reaches the agent
        assert (await backend.call(sid, {"op": "read", "path": "/home/user/b.txt"}))["error"]["code"] == "not_found"
        assert (await backend.call(sid, {"op": "ping"})) == {"ok": True}
        assert (await backend.call(sid, {"op": "chmod"}))["error"]["code"] == "unimplemented"
        assert (await backend.call(sid, {"op": "write", "path": "x", "data": "%%%"}))["error"]["code"] == \
            "invalid_argument"

    asyncio.run(drive())
    assert backend.alive(sid) and backend.door_path(sid) is None
    backend.kill(sid)
    assert fake.kills == [ref] and fake.live(ref) is None
    assert not backend.alive(sid)
    backend.kill(sid)  # idempotent
    with pytest.raises(NotFound):
        asyncio.run(backend.call(sid, {"op": "ping"}))

    # the control plane saw only the platform's key; the daemon only the sandbox's access token
    assert fake.api_keys == {PLATFORM_KEY}
    daemon = fake.daemon_requests()
    assert daemon and all(r.headers.get("x-access-token") == fake.sandboxes[ref].access_token
                          and r.headers["e2b-sandbox-id"] == ref and "x-api-key" not in r.headers for r in daemon)


@pytest.mark.parametrize("field, value", [("rsigym_run", "run_other"), ("rsigym_sandbox", "sbx_other")])
def test_a_sandbox_naming_another_run_or_sandbox_is_refused_and_never_killed(
        make_backend: Callable[..., E2BCloudBackend], fake_e2b: tuple[str, FakeE2BState],
        caplog: pytest.LogCaptureFixture, field: str, value: str) -> None:
    _, fake = fake_e2b
    backend = make_backend(check_every_s=0.0)
    caplog.set_level(logging.WARNING, logger="rsigym.sandbox")
    first_use, first_kill, first_check = (backend.create(spec(f"sbx_{n}")) for n in ("use", "kill", "check"))
    for ref in (first_use, first_kill, first_check):
        fake.sandboxes[ref].metadata[field] = value  # E2B's record now names someone else

    with pytest.raises(NotFound):
        asyncio.run(backend.call("sbx_use", {"op": "stat", "path": "/home/user"}))

    async def stream() -> list[dict[str, Any]]:
        return [e async for e in backend.stream("sbx_use", {"op": "start", "cmd": "true"})]

    with pytest.raises(NotFound):
        asyncio.run(stream())
    assert not fake.daemon_requests()  # nothing reached the foreign sandbox's daemon
    assert not backend.alive("sbx_use")
    assert not backend.alive("sbx_check")
    for sid in ("sbx_use", "sbx_kill", "sbx_check"):
        backend.kill(sid)
    assert fake.kills == []
    assert {s.id for s in fake.running()} == {first_use, first_kill, first_check}
    assert caplog.text.count("refused") == 3


def test_alive_renews_the_e2b_timeout_and_notices_an_ended_sandbox(make_backend: Callable[..., E2BCloudBackend],
                                                                   fake_e2b: tuple[str, FakeE2BState]) -> None:
    _, fake = fake_e2b
    backend = make_backend(check_every_s=0.0, renew_within_s=60.0, lease_s=240)
    ref = backend.create(spec(timeout_s=30))
    assert backend.alive("sbx_gym1")
    assert fake.timeouts == [(ref, 240)]
    assert backend.alive("sbx_gym1") and fake.timeouts == [(ref, 240)]  # renewed only when due
    fake.end(fake.sandboxes[ref])  # E2B ended it
    assert not backend.alive("sbx_gym1")
    lazy = make_backend()  # the default: asks E2B at most every 30 s
    ref = lazy.create(spec("sbx_lazy"))
    requests = len(fake.requests)
    assert all(lazy.alive("sbx_lazy") for _ in range(20)) and len(fake.requests) == requests
    assert "entry" in asyncio.run(lazy.call("sbx_lazy", {"op": "stat", "path": "/home/user"}))
    fake.end(fake.sandboxes[ref])  # E2B ended it while in use: the agent hears not_found, alive() asks at once
    answer = asyncio.run(lazy.call("sbx_lazy", {"op": "stat", "path": "/home/user"}))
    assert answer["error"] == {"code": "not_found", "message": "the sandbox is not running"}
    assert not lazy.alive("sbx_lazy")


def test_refusals(fake_e2b: tuple[str, FakeE2BState], make_backend: Callable[..., E2BCloudBackend],
                  tmp_path: Path) -> None:
    url, fake = fake_e2b
    with pytest.raises(ServiceUnavailable, match="E2B_API_KEY"):
        E2BCloudBackend.from_context(context(url, tmp_path, key=None))
    backend = make_backend()
    with pytest.raises(Unprocessable, match="door"):
        backend.create(spec(door_port=8000))
    with pytest.raises(Unprocessable):
        backend.create(spec(owner=""))
    wrong = E2BCloudBackend.from_context(context(url, tmp_path, key="e2b_wrong"))
    with pytest.raises(ServiceUnavailable, match="refused the gym's API key"):
        wrong.create(spec())
    assert fake.creates == [] and not fake.sandboxes


# -- end to end: the agent's SDK -> the gym -> E2B ----------------------------------------


def test_agent_sdk_through_the_gym_reaches_e2b_only_with_the_platform_key(
        make_gym: Callable[..., Any], standin: tuple[str, Any], teacher_secret: str,
        fake_e2b: tuple[str, FakeE2BState]) -> None:
    url, fake = fake_e2b
    config = GymConfig.model_validate({**gym_config(standin[0]).model_dump(), "sandbox": sandbox_config(url)})
    gym = make_gym(config=with_sandbox_url(config, url),
                   secrets_={TEACHER_ENV: teacher_secret, "E2B_API_KEY": PLATFORM_KEY})
    with serve_gym(gym) as gym_url:
        with httpx.Client(base_url=gym_url) as c:
            created = create_key(c, budget_usd=1.0)
        key = created["key"]
        opts = {"api_key": key, "api_url": f"{gym_url}/sandbox", "sandbox_url": f"{gym_url}/sandbox/envd"}
        sbx = Sandbox.create(template="base", timeout=120, metadata={"purpose": "e2e", "rsigym_run": "run_evil"},
                             envs={"GREETING": "hi"}, **opts)
        try:
            out: list[str] = []
            result = sbx.commands.run("echo $GREETING; for i in 1 2; do echo line$i; done; echo oops >&2",
                                      on_stdout=out.append)
            assert result.exit_code == 0
            assert result.stdout.splitlines() == ["hi", "line1", "line2"]
            assert result.stderr.strip() == "oops"
            assert "".join(out).count("line") == 2
            with pytest.raises(CommandExitException) as failed:
                sbx.commands.run("echo bad; exit 7")
            assert failed.value.exit_code == 7

            sbx.files.write("/home/user/notes/hello.txt", "hello sandbox")
            assert sbx.files.read("/home/user/notes/hello.txt") == "hello sandbox"
            assert [e.name for e in sbx.files.list("/home/user/notes")] == ["hello.txt"]
            assert sbx.files.exists("/home/user/notes/hello.txt")
            assert not sbx.files.exists("/home/user/missing")
            sbx.files.make_dir("/home/user/d2")
            sbx.files.remove("/home/user/notes/hello.txt")
            assert not sbx.files.exists("/home/user/notes/hello.txt")

            handle = sbx.commands.run("sleep 300", background=True)
            assert handle.pid in [p.pid for p in sbx.commands.list()]
            assert sbx.commands.kill(handle.pid)
        finally:
            assert sbx.kill() is True

    (remote,) = fake.sandboxes.values()
    assert fake.creates[0]["templateID"] == "rsigym-base"
    assert remote.metadata == {"purpose": "e2e", "rsigym_run": created["run_id"], "rsigym_sandbox": sbx.sandbox_id}
    assert remote.allow_internet_access is False and remote.network["denyOut"] == ["0.0.0.0/0"]
    assert fake.kills == [remote.id] and remote.state == "killed"
    # the platform's key reached E2B; the agent's key and the gym's sandbox tokens never did
    assert fake.api_keys == {PLATFORM_KEY}
    assert not any(key in value for value in fake.header_values())
    assert {r.headers["x-access-token"] for r in fake.daemon_requests()} == {remote.access_token}
