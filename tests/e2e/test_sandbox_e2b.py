"""The unmodified ``e2b`` SDK against a running gym: create, run with streamed output and
exit code, write/read/list files, kill — and what the sandbox may not see or do."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from e2b import CommandExitException
from e2b.exceptions import NotFoundException, SandboxException

from tests.conftest import create_key
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture
def served(gym: Any) -> Iterator[tuple[str, Any]]:
    with serve_gym(gym) as url:
        yield url, gym


def e2b_opts(url: str, key: str) -> dict[str, Any]:
    return {"api_key": key, "api_url": f"{url}/sandbox", "sandbox_url": f"{url}/sandbox/envd"}


def test_unmodified_sdk_round_trip(served: tuple[str, Any]) -> None:
    url, gym = served
    with httpx.Client(base_url=url) as c:
        key = create_key(c, budget_usd=1.0)["key"]
    opts = e2b_opts(url, key)
    sbx = Sandbox.create(template="base", timeout=120, metadata={"purpose": "test"}, envs={"GREETING": "hi"}, **opts)
    try:
        out: list[str] = []
        result = sbx.commands.run("echo $GREETING; for i in 1 2 3; do echo line$i; done; echo oops >&2; exit 0",
                                  on_stdout=out.append)
        assert result.exit_code == 0
        assert result.stdout.splitlines() == ["hi", "line1", "line2", "line3"]
        assert result.stderr.strip() == "oops"
        assert "".join(out).count("line") == 3  # streamed through the callback as it came
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("echo bad; exit 7")
        assert failed.value.exit_code == 7

        sbx.files.write("/home/user/notes/hello.txt", "hello sandbox")
        assert sbx.files.read("/home/user/notes/hello.txt") == "hello sandbox"
        names = [e.name for e in sbx.files.list("/home/user/notes")]
        assert names == ["hello.txt"]
        assert sbx.files.exists("/home/user/notes/hello.txt")
        assert not sbx.files.exists("/home/user/missing")
        sbx.files.make_dir("/home/user/d2")
        sbx.files.remove("/home/user/notes/hello.txt")
        assert not sbx.files.exists("/home/user/notes/hello.txt")
        assert sbx.commands.run("cat /home/user/notes/hello.txt 2>&1 || true").stdout.strip().endswith(
            "No such file or directory")

        listed = Sandbox.list(**opts).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
        assert listed[0].metadata == {"purpose": "test"}
        sbx.set_timeout(60)
    finally:
        assert sbx.kill() is True
    assert Sandbox.list(**opts).next_items() == []
    with pytest.raises((NotFoundException, SandboxException)):
        sbx.commands.run("true")


def test_background_process_list_and_kill(served: tuple[str, Any]) -> None:
    url, _ = served
    with httpx.Client(base_url=url) as c:
        key = create_key(c, budget_usd=1.0)["key"]
    sbx = Sandbox.create(template="base", timeout=60, **e2b_opts(url, key))
    try:
        handle = sbx.commands.run("sleep 300", background=True)
        pids = [p.pid for p in sbx.commands.list()]
        assert handle.pid in pids
        assert sbx.commands.kill(handle.pid)
        deadline = time.time() + 5
        while handle.pid in [p.pid for p in sbx.commands.list()] and time.time() < deadline:
            time.sleep(0.1)
        assert handle.pid not in [p.pid for p in sbx.commands.list()]
    finally:
        sbx.kill()


def test_a_run_sees_only_its_own_sandboxes(served: tuple[str, Any]) -> None:
    url, _ = served
    with httpx.Client(base_url=url) as c:
        mine, other = create_key(c)["key"], create_key(c)["key"]
        sbx = Sandbox.create(template="base", timeout=60, **e2b_opts(url, mine))
        try:
            for method, path in (("GET", f"/sandbox/sandboxes/{sbx.sandbox_id}"),
                                 ("DELETE", f"/sandbox/sandboxes/{sbx.sandbox_id}"),
                                 ("POST", f"/sandbox/sandboxes/{sbx.sandbox_id}/timeout")):
                r = c.request(method, path, headers={"X-API-Key": other}, json={"timeout": 5})
                assert r.status_code == 404, (method, path, r.text)
            assert c.get("/sandbox/v2/sandboxes", headers={"X-API-Key": other}).json() == []
            # the other run's key cannot drive the daemon either, even with the right sandbox id
            r = c.get("/sandbox/envd/files", params={"path": "/etc/hostname"},
                      headers={"X-API-Key": other, "E2b-Sandbox-Id": sbx.sandbox_id})
            assert r.status_code == 404
            # a forged access token is refused at the gateway
            r = c.get("/sandbox/envd/files", params={"path": "/etc/hostname"},
                      headers={"X-Access-Token": f"sbt.key_x.{sbx.sandbox_id}.{'0' * 64}",
                               "E2b-Sandbox-Id": sbx.sandbox_id})
            assert r.status_code == 401
            assert sbx.is_running()
        finally:
            sbx.kill()
