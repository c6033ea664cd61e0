"""The sandbox daemon protocol (E2B's envd), served with the e2b package's own Connect stubs.

``ProcessASGIApplication`` / ``FilesystemASGIApplication`` come from the ``e2b`` package
(e2b/envd/*/…_connect.py); we only implement the service methods, translating each RPC to
the backend's agent protocol. Which sandbox a call is for comes from the ``E2b-Sandbox-Id``
header; who is calling comes from the gateway-signed identity, checked before any RPC runs
(see :class:`EnvdDispatch`) and handed over in a context variable.
"""

from __future__ import annotations

import base64
import contextvars
import signal as signals
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb as fpb
from e2b.envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from e2b.envd.process import process_pb as ppb
from e2b.envd.process.process_connect import Process, ProcessASGIApplication
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from kit.errors import GymError
from kit.identity import Identity
from services.sandbox.service import SandboxService

CURRENT_IDENTITY: contextvars.ContextVar[Identity] = contextvars.ContextVar("rsigym_sandbox_identity")
SANDBOX_HEADER = "e2b-sandbox-id"
_GYM_TO_CONNECT = {400: Code.INVALID_ARGUMENT, 401: Code.UNAUTHENTICATED, 402: Code.RESOURCE_EXHAUSTED,
                   403: Code.PERMISSION_DENIED, 404: Code.NOT_FOUND, 409: Code.ALREADY_EXISTS,
                   422: Code.INVALID_ARGUMENT, 429: Code.RESOURCE_EXHAUSTED, 503: Code.UNAVAILABLE}
# Oneof field names, typed as literals: mypy widens a bare "start" to str where a union of Oneofs is expected.
_START: Literal["start"] = "start"
_DATA: Literal["data"] = "data"
_END: Literal["end"] = "end"
_STDOUT: Literal["stdout"] = "stdout"
_STDERR: Literal["stderr"] = "stderr"


class _Envd:
    def __init__(self, service: SandboxService):
        self.service = service

    async def _sandbox(self, ctx: Any) -> str:
        sandbox_id = ctx.request_headers.get(SANDBOX_HEADER)
        if not sandbox_id:
            raise ConnectError(Code.INVALID_ARGUMENT, "the E2b-Sandbox-Id header is required")
        try:
            await self.service.check_owned_async(CURRENT_IDENTITY.get(), sandbox_id)
        except GymError as err:
            raise _connect_error(err) from err
        return sandbox_id

    async def _call(self, ctx: Any, request: dict[str, Any]) -> dict[str, Any]:
        sandbox_id = await self._sandbox(ctx)
        try:
            answer = await self.service.backend.call(sandbox_id, request)
        except GymError as err:
            raise _connect_error(err) from err
        if "error" in answer:
            raise _agent_error(answer["error"])
        return answer


class ProcessService(_Envd, Process):
    async def list(self, request: ppb.ListRequest, ctx: Any) -> ppb.ListResponse:
        answer = await self._call(ctx, {"op": "list"})
        return ppb.ListResponse(processes=[
            ppb.ProcessInfo(pid=p["pid"], tag=p.get("tag"), config=ppb.ProcessConfig(
                cmd=p.get("cmd") or "", args=p.get("args") or [], envs=p.get("envs") or {}, cwd=p.get("cwd")))
            for p in answer.get("processes", [])
        ])

    async def start(self, request: ppb.StartRequest, ctx: Any) -> AsyncIterator[ppb.StartResponse]:
        if request.pty is not None:
            raise ConnectError(Code.UNIMPLEMENTED, "PTY sessions are not offered by this gym's sandboxes")
        config = request.process or ppb.ProcessConfig()
        body = {"op": "start", "cmd": config.cmd, "args": list(config.args), "envs": dict(config.envs),
                "cwd": config.cwd or None, "tag": request.tag or None, "stdin": bool(request.stdin)}
        async for event in self._events(ctx, body):
            yield ppb.StartResponse(event=event)

    async def connect(self, request: ppb.ConnectRequest, ctx: Any) -> AsyncIterator[ppb.ConnectResponse]:
        body = {"op": "connect", "pid": _pid(request.process)}
        async for event in self._events(ctx, body):
            yield ppb.ConnectResponse(event=event)

    async def _events(self, ctx: Any, body: dict[str, Any]) -> AsyncIterator[ppb.ProcessEvent]:
        sandbox_id = await self._sandbox(ctx)
        try:
            async for ev in self.service.backend.stream(sandbox_id, body):
                if "error" in ev:
                    raise _agent_error(ev["error"])
                if "start" in ev:
                    yield ppb.ProcessEvent(event=Oneof(_START, ppb.ProcessEvent.StartEvent(pid=ev["start"]["pid"])))
                elif "stdout" in ev or "stderr" in ev:
                    output = (Oneof(_STDOUT, base64.b64decode(ev["stdout"])) if "stdout" in ev
                              else Oneof(_STDERR, base64.b64decode(ev["stderr"])))
                    yield ppb.ProcessEvent(event=Oneof(_DATA, ppb.ProcessEvent.DataEvent(output=output)))
                elif "end" in ev:
                    end = ev["end"]
                    yield ppb.ProcessEvent(event=Oneof(_END, ppb.ProcessEvent.EndEvent(
                        exit_code=int(end.get("exit_code", -1)), exited=True, status=str(end.get("status", "")),
                        error=end.get("error"))))
                    return
        except GymError as err:
            raise _connect_error(err) from err

    async def send_signal(self, request: ppb.SendSignalRequest, ctx: Any) -> ppb.SendSignalResponse:
        sig = signals.SIGTERM if request.signal == ppb.Signal.SIGTERM else signals.SIGKILL
        await self._call(ctx, {"op": "signal", "pid": _pid(request.process), "signal": int(sig)})
        return ppb.SendSignalResponse()

    async def send_input(self, request: ppb.SendInputRequest, ctx: Any) -> ppb.SendInputResponse:
        data = request.input.input.value if request.input and request.input.input else b""
        await self._call(ctx, {"op": "input", "pid": _pid(request.process), "data": base64.b64encode(data).decode()})
        return ppb.SendInputResponse()

    async def close_stdin(self, request: ppb.CloseStdinRequest, ctx: Any) -> ppb.CloseStdinResponse:
        await self._call(ctx, {"op": "close_stdin", "pid": _pid(request.process)})
        return ppb.CloseStdinResponse()

    async def update(self, request: ppb.UpdateRequest, ctx: Any) -> ppb.UpdateResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "PTY sessions are not offered by this gym's sandboxes")

    async def stream_input(self, request: Any, ctx: Any) -> ppb.StreamInputResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "streamed stdin is not offered; use SendInput")


class FilesystemService(_Envd, Filesystem):
    async def stat(self, request: fpb.StatRequest, ctx: Any) -> fpb.StatResponse:
        return fpb.StatResponse(entry=entry_info((await self._call(ctx, {"op": "stat", "path": request.path}))["entry"]))

    async def make_dir(self, request: fpb.MakeDirRequest, ctx: Any) -> fpb.MakeDirResponse:
        answer = await self._call(ctx, {"op": "mkdir", "path": request.path})
        if not answer.get("created"):
            raise ConnectError(Code.ALREADY_EXISTS, f"directory {request.path} already exists")
        return fpb.MakeDirResponse(entry=entry_info(answer["entry"]))

    async def move(self, request: fpb.MoveRequest, ctx: Any) -> fpb.MoveResponse:
        answer = await self._call(ctx, {"op": "rename", "path": request.source, "destination": request.destination})
        return fpb.MoveResponse(entry=entry_info(answer["entry"]))

    async def list_dir(self, request: fpb.ListDirRequest, ctx: Any) -> fpb.ListDirResponse:
        answer = await self._call(ctx, {"op": "listdir", "path": request.path, "depth": request.depth or 1})
        return fpb.ListDirResponse(entries=[entry_info(e) for e in answer["entries"]])

    async def remove(self, request: fpb.RemoveRequest, ctx: Any) -> fpb.RemoveResponse:
        await self._call(ctx, {"op": "remove", "path": request.path})
        return fpb.RemoveResponse()

    async def watch_dir(self, request: Any, ctx: Any) -> AsyncIterator[Any]:
        raise ConnectError(Code.UNIMPLEMENTED, "directory watches are not offered by this gym's sandboxes")
        yield  # pragma: no cover - makes this an async generator

    async def create_watcher(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "directory watches are not offered by this gym's sandboxes")

    async def get_watcher_events(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "directory watches are not offered by this gym's sandboxes")

    async def remove_watcher(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "directory watches are not offered by this gym's sandboxes")


def entry_info(e: dict[str, Any]) -> fpb.EntryInfo:
    kind = {"file": fpb.FileType.FILE, "directory": fpb.FileType.DIRECTORY}.get(e.get("type", ""), fpb.FileType.FILE)
    mtime = datetime.fromtimestamp(float(e.get("modified_time") or 0), UTC)
    return fpb.EntryInfo(
        name=e["name"], type=kind, path=e["path"], size=int(e.get("size", 0)), mode=int(e.get("mode", 0)),
        permissions=e.get("permissions", ""), owner=e.get("owner", ""), group=e.get("group", ""),
        modified_time=Timestamp(seconds=int(mtime.timestamp()), nanos=mtime.microsecond * 1000),
        symlink_target=e.get("symlink_target"), is_symlink=e.get("symlink_target") is not None,
    )


def _pid(selector: ppb.ProcessSelector | None) -> int:
    if selector is None or selector.selector is None:
        raise ConnectError(Code.INVALID_ARGUMENT, "a process selector is required")
    if selector.selector.field != "pid":
        raise ConnectError(Code.UNIMPLEMENTED, "select processes by pid")
    return int(selector.selector.value)


def _agent_error(error: dict[str, Any]) -> ConnectError:
    try:
        code = Code(error.get("code", "internal"))
    except ValueError:
        code = Code.INTERNAL
    return ConnectError(code, str(error.get("message", "sandbox error")))


def _connect_error(err: GymError) -> ConnectError:
    return ConnectError(_GYM_TO_CONNECT.get(err.status, Code.INTERNAL), err.message)


class _CallersCodec:
    """A Connect codec whose message that cannot be decoded (not UTF-8, a lone surrogate, a string
    where a number goes, a number out of its range, truncated binary) is the caller's error,
    ``invalid_argument`` (400): connectrpc answers anything a codec raises ``unknown``, a 500."""

    def __init__(self, inner: Codec[Any, Any]):
        self.inner = inner

    def name(self) -> str:
        return self.inner.name()

    def encode(self, message: Any) -> bytes:
        return self.inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return self.inner.decode(data, message_class)
        except (ValueError, TypeError, ArithmeticError) as err:  # UnicodeDecodeError and JSON errors included
            raise ConnectError(Code.INVALID_ARGUMENT, f"the request message cannot be decoded: {err}") from err


def connect_apps(service: SandboxService) -> dict[str, Any]:
    """Path prefix → the e2b package's Connect ASGI app serving our implementation."""
    codecs = [_CallersCodec(proto_binary_codec()), _CallersCodec(proto_json_codec())]
    return {
        "/process.Process/": ProcessASGIApplication(ProcessService(service), codecs=codecs),
        "/filesystem.Filesystem/": FilesystemASGIApplication(FilesystemService(service), codecs=codecs),
    }
