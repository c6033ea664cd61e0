"""A stand-in for E2B's cloud: its control plane and the sandbox daemon (envd), in one app.

Control plane (authenticated with ``X-API-KEY``): ``POST /v2/sandboxes`` (with
``Idempotency-Key``), ``GET /sandboxes/{id}``, ``DELETE /sandboxes/{id}``,
``POST /sandboxes/{id}/timeout``, ``POST /v2/sandboxes/{id}/connect``, ``GET /v2/sandboxes``
— with E2B's shapes and status codes (401 bad key, 404 unknown or ended sandbox).

Daemon (what the SDK reaches at ``sandbox_url``, routed by ``E2b-Sandbox-Id`` and
authenticated with the sandbox's ``X-Access-Token``): ``GET /health``, ``GET``/``POST /files``
and the Connect RPCs of ``process.Process`` and ``filesystem.Filesystem``, served with the
e2b package's own ASGI stubs. A sandbox is a temp directory standing in for its root
filesystem (``/home/user`` is its home); commands run as plain subprocesses there. A sandbox
ends when killed or when its timeout runs out, like E2B's.

Every request is recorded (method, path, headers) for assertions (``app.state``), and so are
create bodies, timeouts and kills.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import secrets
import shutil
import signal
import stat
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb as fpb
from e2b.envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from e2b.envd.process import process_pb as ppb
from e2b.envd.process.process_connect import Process, ProcessASGIApplication
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

ENVD_VERSION = "0.5.7"
HOME = "/home/user"
PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeProcess:
    pid: int
    config: ppb.ProcessConfig
    tag: str | None
    process: asyncio.subprocess.Process
    subscribers: list[asyncio.Queue] = field(default_factory=list)
    done: bool = False
    watcher: asyncio.Future[None] | None = None  # held here: the loop keeps only a weak reference


@dataclass
class FakeSandbox:
    id: str
    template_id: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    allow_internet_access: bool | None
    network: dict[str, Any] | None
    access_token: str
    root: Path
    started_at: float
    end_at: float
    state: str = "running"
    processes: dict[int, FakeProcess] = field(default_factory=dict)

    def host(self, path: str) -> Path:
        """The host path behind a path inside the sandbox (relative paths start at home)."""
        inside = posixpath.normpath(path if path.startswith("/") else posixpath.join(HOME, path or "."))
        return self.root / inside.lstrip("/")

    def inside(self, host: Path) -> str:
        return "/" + str(host.relative_to(self.root)).removeprefix(".")


@dataclass
class FakeE2BState:
    api_key: str
    root: Path
    sandboxes: dict[str, FakeSandbox] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    creates: list[dict[str, Any]] = field(default_factory=list)
    timeouts: list[tuple[str, int]] = field(default_factory=list)
    kills: list[str] = field(default_factory=list)
    idempotency: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- what tests read ------------------------------------------------------------------

    @property
    def api_keys(self) -> set[str]:
        """Every X-API-KEY the control plane was sent."""
        return {r.headers["x-api-key"] for r in self.requests if "x-api-key" in r.headers}

    def header_values(self) -> list[str]:
        return [v for r in self.requests for v in r.headers.values()]

    def daemon_requests(self) -> list[Seen]:
        return [r for r in self.requests if "e2b-sandbox-id" in r.headers]

    def running(self) -> list[FakeSandbox]:
        return [s for s in list(self.sandboxes.values()) if self.live(s.id) is not None]

    # -- the sandbox lifecycle --------------------------------------------------------------

    def live(self, sandbox_id: str) -> FakeSandbox | None:
        sbx = self.sandboxes.get(sandbox_id)
        if sbx is not None and sbx.state == "running" and time.time() >= sbx.end_at:
            self.end(sbx)
        return sbx if sbx is not None and sbx.state == "running" else None

    def end(self, sbx: FakeSandbox) -> None:
        sbx.state = "killed"
        for proc in list(sbx.processes.values()):
            _killpg(proc.pid, signal.SIGKILL)

    def create(self, body: dict[str, Any]) -> FakeSandbox:
        sandbox_id = "i" + secrets.token_hex(8)
        root = self.root / sandbox_id
        (root / HOME.lstrip("/")).mkdir(parents=True)
        (root / "tmp").mkdir()
        now = time.time()
        sbx = FakeSandbox(
            id=sandbox_id, template_id=body["templateID"], metadata=dict(body.get("metadata") or {}),
            env_vars=dict(body.get("envVars") or {}), allow_internet_access=body.get("allow_internet_access"),
            network=body.get("network"), access_token="ea_" + secrets.token_hex(16), root=root,
            started_at=now, end_at=now + int(body.get("timeout") or 15),
        )
        with self.lock:
            self.sandboxes[sandbox_id] = sbx
        return sbx


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _created(sbx: FakeSandbox) -> dict[str, Any]:
    return {"templateID": sbx.template_id, "sandboxID": sbx.id, "clientID": "fake", "envdVersion": ENVD_VERSION,
            "envdAccessToken": sbx.access_token, "domain": None, "alias": sbx.template_id}


def _listed(sbx: FakeSandbox) -> dict[str, Any]:
    return {"templateID": sbx.template_id, "alias": sbx.template_id, "sandboxID": sbx.id, "clientID": "fake",
            "startedAt": _iso(sbx.started_at), "endAt": _iso(sbx.end_at), "cpuCount": 2, "memoryMB": 512,
            "diskSizeMB": 1024, "state": "running", "envdVersion": ENVD_VERSION, "metadata": sbx.metadata}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- the daemon's Connect services --------------------------------------------------------


class _Daemon:
    def __init__(self, state: FakeE2BState):
        self.state = state

    def sandbox(self, ctx: Any) -> FakeSandbox:
        headers = ctx.request_headers
        sbx = self.state.live(headers.get("e2b-sandbox-id") or "")
        if sbx is None:
            raise ConnectError(Code.UNAVAILABLE, f"The sandbox {headers.get('e2b-sandbox-id')} was not found")
        if headers.get("x-access-token") != sbx.access_token:
            raise ConnectError(Code.UNAUTHENTICATED, "invalid access token")
        return sbx


def _pid(selector: ppb.ProcessSelector | None) -> int:
    if selector is None or selector.selector is None or selector.selector.field != "pid":
        raise ConnectError(Code.INVALID_ARGUMENT, "select the process by pid")
    return int(selector.selector.value)


class FakeProcessService(_Daemon, Process):
    """PTYs, Update and StreamInput answer UNIMPLEMENTED (the stubs' defaults)."""

    async def list(self, request: ppb.ListRequest, ctx: Any) -> ppb.ListResponse:
        sbx = self.sandbox(ctx)
        return ppb.ListResponse(processes=[ppb.ProcessInfo(config=p.config, pid=p.pid, tag=p.tag)
                                           for p in sbx.processes.values() if not p.done])

    async def start(self, request: ppb.StartRequest, ctx: Any) -> AsyncIterator[ppb.StartResponse]:
        sbx = self.sandbox(ctx)
        config = request.process or ppb.ProcessConfig()
        env = {"PATH": PATH, "HOME": str(sbx.host(HOME)), **sbx.env_vars, **dict(config.envs)}
        try:
            process = await asyncio.create_subprocess_exec(
                config.cmd, *config.args, cwd=sbx.host(config.cwd or HOME), env=env,
                stdin=asyncio.subprocess.PIPE if request.stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
            )
        except OSError as err:
            raise ConnectError(Code.INVALID_ARGUMENT, f"could not start {config.cmd}: {err}") from err
        proc = FakeProcess(process.pid, config, request.tag, process)
        queue: asyncio.Queue = asyncio.Queue()
        proc.subscribers.append(queue)
        sbx.processes[proc.pid] = proc
        proc.watcher = asyncio.ensure_future(_watch(sbx, proc))
        yield ppb.StartResponse(event=ppb.ProcessEvent(event=Oneof("start", ppb.ProcessEvent.StartEvent(pid=proc.pid))))
        async for event in _follow(proc, queue):
            yield ppb.StartResponse(event=event)

    async def connect(self, request: ppb.ConnectRequest, ctx: Any) -> AsyncIterator[ppb.ConnectResponse]:
        sbx = self.sandbox(ctx)
        proc = sbx.processes.get(_pid(request.process))
        if proc is None or proc.done:
            raise ConnectError(Code.NOT_FOUND, f"process {_pid(request.process)} not found")
        queue: asyncio.Queue = asyncio.Queue()
        proc.subscribers.append(queue)
        start = ppb.ProcessEvent.StartEvent(pid=proc.pid)
        yield ppb.ConnectResponse(event=ppb.ProcessEvent(event=Oneof("start", start)))
        async for event in _follow(proc, queue):
            yield ppb.ConnectResponse(event=event)

    def _proc(self, ctx: Any, selector: ppb.ProcessSelector | None) -> FakeProcess:
        proc = self.sandbox(ctx).processes.get(_pid(selector))
        if proc is None or proc.done:
            raise ConnectError(Code.NOT_FOUND, f"process {_pid(selector)} not found")
        return proc

    async def send_signal(self, request: ppb.SendSignalRequest, ctx: Any) -> ppb.SendSignalResponse:
        proc = self._proc(ctx, request.process)
        _killpg(proc.pid, signal.SIGTERM if request.signal == ppb.Signal.SIGTERM else signal.SIGKILL)
        return ppb.SendSignalResponse()

    async def send_input(self, request: ppb.SendInputRequest, ctx: Any) -> ppb.SendInputResponse:
        proc = self._proc(ctx, request.process)
        if proc.process.stdin is None:
            raise ConnectError(Code.FAILED_PRECONDITION, "the process was started without stdin")
        proc.process.stdin.write(request.input.input.value if request.input and request.input.input else b"")
        await proc.process.stdin.drain()
        return ppb.SendInputResponse()

    async def close_stdin(self, request: ppb.CloseStdinRequest, ctx: Any) -> ppb.CloseStdinResponse:
        proc = self._proc(ctx, request.process)
        if proc.process.stdin is not None:
            proc.process.stdin.close()
        return ppb.CloseStdinResponse()


async def _pump(proc: FakeProcess, stream: asyncio.StreamReader | None, name: str) -> None:
    while stream is not None and (chunk := await stream.read(32 * 1024)):
        data = ppb.ProcessEvent.DataEvent(output=Oneof(name, chunk))
        for q in list(proc.subscribers):
            q.put_nowait(ppb.ProcessEvent(event=Oneof("data", data)))


async def _watch(sbx: FakeSandbox, proc: FakeProcess) -> None:
    await asyncio.gather(_pump(proc, proc.process.stdout, "stdout"), _pump(proc, proc.process.stderr, "stderr"))
    code = await proc.process.wait()
    status = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name.lower()[3:]}"
    proc.done = True
    end = ppb.ProcessEvent.EndEvent(exit_code=code if code >= 0 else -1, exited=code >= 0, status=status,
                                    error=None if code == 0 else status)
    for q in list(proc.subscribers):
        q.put_nowait(ppb.ProcessEvent(event=Oneof("end", end)))
    sbx.processes.pop(proc.pid, None)


async def _follow(proc: FakeProcess, queue: asyncio.Queue) -> AsyncIterator[ppb.ProcessEvent]:
    try:
        while True:
            event = await queue.get()
            yield event
            if event.event is not None and event.event.field == "end":
                return
    finally:
        if queue in proc.subscribers:
            proc.subscribers.remove(queue)


def _entry(sbx: FakeSandbox, host: Path) -> fpb.EntryInfo:
    st = os.lstat(host)
    link = os.readlink(host) if stat.S_ISLNK(st.st_mode) else None
    is_dir = stat.S_ISDIR(os.stat(host).st_mode) if link is not None and host.exists() else stat.S_ISDIR(st.st_mode)
    return fpb.EntryInfo(
        name=host.name if host != sbx.root else "/", type=fpb.FileType.DIRECTORY if is_dir else fpb.FileType.FILE,
        path=sbx.inside(host), size=st.st_size, mode=stat.S_IMODE(st.st_mode), permissions=stat.filemode(st.st_mode),
        owner="user", group="user", modified_time=Timestamp(seconds=int(st.st_mtime)), symlink_target=link,
        is_symlink=link is not None,
    )


def _fs_errors(path: str, err: OSError) -> ConnectError:
    if isinstance(err, FileNotFoundError):
        return ConnectError(Code.NOT_FOUND, f"path not found: {path}")
    if isinstance(err, FileExistsError):
        return ConnectError(Code.ALREADY_EXISTS, f"already exists: {path}")
    if isinstance(err, PermissionError):
        return ConnectError(Code.PERMISSION_DENIED, f"permission denied: {path}")
    return ConnectError(Code.INVALID_ARGUMENT, f"{path}: {err}")


class FakeFilesystemService(_Daemon, Filesystem):
    """Watchers answer UNIMPLEMENTED (the stubs' defaults)."""

    async def stat(self, request: fpb.StatRequest, ctx: Any) -> fpb.StatResponse:
        sbx = self.sandbox(ctx)
        try:
            return fpb.StatResponse(entry=_entry(sbx, sbx.host(request.path)))
        except OSError as err:
            raise _fs_errors(request.path, err) from err

    async def make_dir(self, request: fpb.MakeDirRequest, ctx: Any) -> fpb.MakeDirResponse:
        sbx = self.sandbox(ctx)
        try:
            sbx.host(request.path).mkdir(parents=True)
            return fpb.MakeDirResponse(entry=_entry(sbx, sbx.host(request.path)))
        except OSError as err:
            raise _fs_errors(request.path, err) from err

    async def move(self, request: fpb.MoveRequest, ctx: Any) -> fpb.MoveResponse:
        sbx = self.sandbox(ctx)
        try:
            os.replace(sbx.host(request.source), sbx.host(request.destination))
            return fpb.MoveResponse(entry=_entry(sbx, sbx.host(request.destination)))
        except OSError as err:
            raise _fs_errors(request.source, err) from err

    async def list_dir(self, request: fpb.ListDirRequest, ctx: Any) -> fpb.ListDirResponse:
        sbx = self.sandbox(ctx)
        top = sbx.host(request.path)
        if not top.is_dir():
            raise ConnectError(Code.NOT_FOUND if not top.exists() else Code.INVALID_ARGUMENT,
                               f"not a directory: {request.path}")
        depth, entries = max(1, request.depth or 1), []
        for root, dirs, files in os.walk(top):
            dirs.sort()
            entries += [_entry(sbx, Path(root) / n) for n in sorted(dirs) + sorted(files)]
            if len(Path(root).relative_to(top).parts) + 1 >= depth:
                dirs[:] = []
        return fpb.ListDirResponse(entries=entries)

    async def remove(self, request: fpb.RemoveRequest, ctx: Any) -> fpb.RemoveResponse:
        sbx = self.sandbox(ctx)
        host = sbx.host(request.path)
        try:
            shutil.rmtree(host) if host.is_dir() and not host.is_symlink() else host.unlink()
        except OSError as err:
            raise _fs_errors(request.path, err) from err
        return fpb.RemoveResponse()


# -- the app -------------------------------------------------------------------------------


def create_fake_e2b(api_key: str, root: Path) -> FakeE2B:  # noqa: C901 - a fake's route table, declared inline
    state = FakeE2BState(api_key, Path(root))
    api = FastAPI()

    def authorized(request: Request) -> bool:
        return request.headers.get("x-api-key") == state.api_key

    def unauthorized() -> JSONResponse:
        return _error(401, "Invalid API key, it must start with 'e2b_'")

    @api.post("/v2/sandboxes")
    @api.post("/sandboxes")
    async def create(request: Request) -> Any:
        if not authorized(request):
            return unauthorized()
        body = await request.json()
        state.creates.append(body)
        key = request.headers.get("idempotency-key")
        if key and key in state.idempotency and (known := state.live(state.idempotency[key])):
            return JSONResponse(_created(known), status_code=201)
        sbx = state.create(body)
        if key:
            state.idempotency[key] = sbx.id
        return JSONResponse(_created(sbx), status_code=201)

    @api.get("/sandboxes/{sandbox_id}")
    async def detail(sandbox_id: str, request: Request) -> Any:
        if not authorized(request):
            return unauthorized()
        sbx = state.live(sandbox_id)
        if sbx is None:
            return _error(404, f"sandbox {sandbox_id} not found")
        return {**_listed(sbx), "envdAccessToken": sbx.access_token, "domain": None,
                "allow_internet_access": sbx.allow_internet_access}

    @api.delete("/sandboxes/{sandbox_id}")
    async def kill(sandbox_id: str, request: Request) -> Any:
        if not authorized(request):
            return unauthorized()
        sbx = state.live(sandbox_id)
        if sbx is None:
            return _error(404, f"sandbox {sandbox_id} not found")
        state.kills.append(sandbox_id)
        state.end(sbx)
        return Response(status_code=204)

    @api.post("/sandboxes/{sandbox_id}/timeout")
    async def set_timeout(sandbox_id: str, request: Request) -> Any:
        if not authorized(request):
            return unauthorized()
        sbx = state.live(sandbox_id)
        if sbx is None:
            return _error(404, f"sandbox {sandbox_id} not found")
        timeout = int((await request.json())["timeout"])
        state.timeouts.append((sandbox_id, timeout))
        sbx.end_at = time.time() + timeout
        return Response(status_code=204)

    @api.post("/v2/sandboxes/{sandbox_id}/connect")
    @api.post("/sandboxes/{sandbox_id}/connect")
    async def connect(sandbox_id: str, request: Request) -> Any:
        if not authorized(request):
            return unauthorized()
        sbx = state.live(sandbox_id)
        if sbx is None:
            return _error(404, f"sandbox {sandbox_id} not found")
        body = await request.json() if await request.body() else {}
        if isinstance(body.get("timeout"), int):
            sbx.end_at = max(sbx.end_at, time.time() + body["timeout"])
        return JSONResponse(_created(sbx), status_code=200)

    @api.get("/v2/sandboxes")
    @api.get("/sandboxes")
    async def list_sandboxes(request: Request, metadata: str | None = None) -> Any:
        if not authorized(request):
            return unauthorized()
        wanted = dict(parse_qsl(metadata)) if metadata else {}
        return [_listed(s) for s in state.running() if all(s.metadata.get(k) == v for k, v in wanted.items())]

    def daemon_sandbox(request: Request) -> FakeSandbox | Response:
        sbx = state.live(request.headers.get("e2b-sandbox-id") or "")
        if sbx is None:
            return _error(502, f"The sandbox {request.headers.get('e2b-sandbox-id')} was not found")
        if request.headers.get("x-access-token") != sbx.access_token:
            return _error(401, "invalid access token")
        return sbx

    @api.get("/health")
    async def health(request: Request) -> Response:
        sbx = daemon_sandbox(request)
        return sbx if isinstance(sbx, Response) else Response(status_code=204)

    @api.get("/files")
    async def read_file(request: Request, path: str) -> Response:
        sbx = daemon_sandbox(request)
        if isinstance(sbx, Response):
            return sbx
        host = sbx.host(path)
        if host.is_dir():
            return _error(400, f"path is a directory: {path}")
        if not host.is_file():
            return _error(404, f"path not found: {path}")
        return Response(host.read_bytes(), media_type="application/octet-stream")

    @api.post("/files")
    async def write_files(request: Request, path: str | None = None) -> Any:
        sbx = daemon_sandbox(request)
        if isinstance(sbx, Response):
            return sbx
        uploads: list[tuple[str, bytes]] = []
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            parts = (await request.form()).getlist("file")
            for part in parts:
                uploads.append((path if path and len(parts) == 1 else part.filename, await part.read()))
        else:
            uploads.append((path or "", await request.body()))
        written = []
        for target, data in uploads:
            host = sbx.host(target)
            if host.is_dir():
                return _error(400, f"path is a directory: {target}")
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_bytes(data)
            written.append({"name": host.name, "type": "file", "path": sbx.inside(host)})
        return written

    return FakeE2B(state, api, {
        "/process.Process/": ProcessASGIApplication(FakeProcessService(state)),
        "/filesystem.Filesystem/": FilesystemASGIApplication(FakeFilesystemService(state)),
    })


class FakeE2B:
    """The ASGI app: records every request, then routes Connect RPCs to the e2b stubs and the
    rest to the FastAPI routes."""

    def __init__(self, state: FakeE2BState, api: FastAPI, rpc: dict[str, Any]):
        self.state, self.api, self.rpc = state, api, rpc

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        self.state.requests.append(Seen(scope["method"], scope["path"], headers))
        target = next((app for prefix, app in self.rpc.items() if scope["path"].startswith(prefix)), None)
        await (target or self.api)(scope, receive, send)

    def close(self) -> None:
        """End every sandbox (kills their processes)."""
        for sbx in list(self.state.sandboxes.values()):
            if sbx.state == "running":
                self.state.end(sbx)
