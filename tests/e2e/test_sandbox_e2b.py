"""The unmodified ``e2b`` SDK against a running gym: create, run with streamed output and
exit code, write/read/list files, kill — and what the sandbox may not see or do."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import CommandExitException, Sandbox
from e2b.exceptions import NotFoundException, SandboxException

from services.sandbox.service import SLOT_SERVICE
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


def test_directories_made_at_create_are_the_sandboxs_own(served: tuple[str, Any]) -> None:
    """The gym's ``rsigymDirs`` extension (what Harbor's environment asks for its log
    directories): made inside the sandbox, with their modes, before the create answers, and
    named in the answer with the parents the create made. Nothing lands on the host; a
    directory that cannot be made, or a path that climbs, refuses the create in the standard
    shape and leaves no sandbox, no slot and no reservation behind."""
    url, gym = served
    marker = f"/tmp/rsigym-made-at-create-{time.monotonic_ns()}"  # /tmp: the sandbox's own tmpfs
    with httpx.Client(base_url=url, timeout=60) as c:
        made_key = create_key(c, budget_usd=1.0)
        key = made_key["key"]
        body = {"templateID": "base", "timeout": 60,
                "rsigymDirs": [{"path": f"{marker}/logs/verifier", "mode": 0o777}, {"path": "/app"}]}
        r = c.post("/sandbox/v2/sandboxes", json=body, headers={"X-API-Key": key})
        assert r.status_code == 201, r.text
        created = r.json()
        assert created["rsigymDirsMade"] == [marker, f"{marker}/logs", f"{marker}/logs/verifier", "/app"]
        sbx = Sandbox.connect(created["sandboxID"], **e2b_opts(url, key))
        try:
            seen = sbx.commands.run(f"stat -c '%a %U' {marker}/logs/verifier /app; ls -A /app | wc -l").stdout.split("\n")
            assert seen[0].split()[0] == "777" and seen[1].split()[0] == "755" and seen[2] == "0"
            assert seen[0].split()[1] == seen[1].split()[1]  # the sandbox's own user made them
        finally:
            sbx.kill()
        assert not os.path.exists(marker)  # made in the sandbox, not on the host

        # /run/rsigym is the one directory the gym's host side binds writable into a sandbox (its
        # agent's socket; root's, 0711, once the agent is ready): nothing may be made or opened there.
        for dirs, said in (([{"path": "/usr/bin/env/under"}], "/usr/bin/env/under"),
                           ([{"path": "/tmp/../etc/x"}], "normal absolute path"),
                           ([{"path": "/app", "mode": 0o4777}], "less than or equal"),
                           ([{"path": "/run/rsigym/planted"}], "permission denied"),
                           ([{"path": "/run/rsigym", "mode": 0o777}], "permission denied")):
            r = c.post("/sandbox/v2/sandboxes", json={"templateID": "base", "rsigymDirs": dirs},
                       headers={"X-API-Key": key})
            assert r.status_code == 422, r.text
            error = r.json()["error"]
            assert said in error["message"] and "rsigymDirs" in (error.get("param") or ""), error
        assert c.get("/sandbox/v2/sandboxes", headers={"X-API-Key": key}).json() == []
        balance = c.get("/v1/balance", headers={"Authorization": f"Bearer {key}"}).json()
        assert balance["reserved_usd"] == 0, balance
        service = gym.service_apps["sandbox"].state.sandbox
        assert service.slots.in_flight(made_key["id"], SLOT_SERVICE) == 0
        planted = [root for root, dirs, _ in os.walk(service.backend.root) if "planted" in dirs]
        assert planted == []  # nothing reached the host's side of the bind


def test_the_file_routes_refuse_in_the_standard_shape(served: tuple[str, Any]) -> None:
    """``/envd/files`` is served past FastAPI's router (services/sandbox/app.py), so it reads its
    own query: a read or a plain-body write without ``path`` is a 422 naming ``path``, a
    directory read is refused, and nothing is written by a refused call."""
    url, _ = served
    with httpx.Client(base_url=url, timeout=60) as c:
        key = create_key(c, budget_usd=1.0)["key"]
        sbx = Sandbox.create(template="base", timeout=60, **e2b_opts(url, key))
        try:
            headers = {"X-API-Key": key, "E2b-Sandbox-Id": sbx.sandbox_id}
            for method, kwargs in (("GET", {}), ("POST", {"content": b"data"})):
                r = c.request(method, "/sandbox/envd/files", headers=headers, **kwargs)
                assert r.status_code == 422 and r.json()["error"]["param"] == "path", r.text
            r = c.get("/sandbox/envd/files", params={"path": "/tmp"}, headers=headers)
            assert r.status_code == 400 and "directory" in r.json()["error"]["message"], r.text
            r = c.post("/sandbox/envd/files", params={"path": "/tmp/x.txt"}, content=b"hello", headers=headers)
            assert r.status_code == 200 and r.json() == [{"name": "x.txt", "type": "file", "path": "/tmp/x.txt"}]
            assert sbx.files.read("/tmp/x.txt") == "hello"
            assert [e.name for e in sbx.files.list("/tmp")] == ["x.txt"]
        finally:
            sbx.kill()
