"""``gym.sandbox``: the gym's E2B-compatible sandboxes, without the ``e2b`` package.

::

    with gym.sandbox.create(template="base", timeout=300) as sbx:   # killed when the block ends
        result = sbx.run("pip list | head", on_stdout=print)        # CommandResult; never raises on exit != 0
        sbx.files.write("/home/user/a.txt", "hi")
        print(sbx.files.read("/home/user/a.txt"), sbx.info().cost_usd)

Two planes, both behind the gateway's ``/sandbox``:

* the control plane (E2B's API: create, set timeout, kill) and the gym's own records
  (``/sandbox/v1/sandboxes``: state, end reason, seconds, cost), called with the run key;
* the sandbox daemon (E2B's envd at ``/sandbox/envd``): files over plain HTTP, processes
  and the filesystem over Connect RPC in its JSON form. The run key is accepted there too,
  with the ``E2b-Sandbox-Id`` header naming the sandbox.

A command's output is a Connect server stream: envelopes of one flag byte, a 4-byte
big-endian length and a JSON message (``{"event": {"start"|"data"|"end": …}}``), closed by
an end-of-stream envelope (flag ``0x02``) whose JSON may hold ``{"error": {code, message}}``.
All decoding lives in :class:`EnvelopeDecoder` and :class:`CommandOutput`; the sync and
async handles differ only in how they read bytes.
"""

from __future__ import annotations

import base64
import builtins
import codecs
import json
import struct
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Self, overload

import httpx

from .._base_client import APICall
from .._response import ObjectList, parse_list, parse_object
from ..errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    ConflictError,
    NotFoundError,
    error_from_body,
    error_from_transport,
)
from ..types import CommandResult, SandboxEntry, SandboxRecord
from ._resource import AsyncResource, SyncResource, drop_none, path_id

if TYPE_CHECKING:
    from .._base_client import AsyncAPIClient, BaseClient, SyncAPIClient

__all__ = [
    "Sandboxes", "AsyncSandboxes", "Sandbox", "AsyncSandbox", "SandboxFiles", "AsyncSandboxFiles",
    "EnvelopeDecoder", "CommandOutput",
]

SANDBOX_HEADER = "E2b-Sandbox-Id"
CONNECT_STREAM = "application/connect+json"
END_STREAM = 0x02
HOME = "/home/user"
OutputCallback = Callable[[str], Any]

# Connect error codes as the HTTP statuses the SDK's error classes stand for.
_CONNECT_STATUS = {
    "invalid_argument": 400, "failed_precondition": 400, "out_of_range": 400, "unauthenticated": 401,
    "permission_denied": 403, "not_found": 404, "already_exists": 409, "aborted": 409,
    "resource_exhausted": 429, "unimplemented": 501, "unavailable": 503, "deadline_exceeded": 504,
}


# ---- control plane and records ----------------------------------------------------------


def _created(response: httpx.Response) -> tuple[str, str]:
    body = _json_of(response)
    if not isinstance(body, dict) or not isinstance(body.get("sandboxID"), str):
        raise APIResponseValidationError("expected {'sandboxID': …} from the sandbox create call", response=response)
    return body["sandboxID"], str(body.get("templateID") or "")


def create_call(template: str | None, timeout: int | None, metadata: Mapping[str, str] | None,
                envs: Mapping[str, str] | None, internet: bool | None) -> APICall[tuple[str, str]]:
    body = drop_none({"templateID": template, "timeout": timeout, "allow_internet_access": internet,
                      "metadata": dict(metadata) if metadata else None, "envVars": dict(envs) if envs else None})
    return APICall("POST", "/sandbox/v2/sandboxes", _created, json=body)


def detail_call(sandbox_id: str) -> APICall[tuple[str, str]]:
    """E2B's view of a running sandbox (404 once it ended)."""
    return APICall("GET", f"/sandbox/sandboxes/{path_id(sandbox_id)}", _created)


def record_call(sandbox_id: str) -> APICall[SandboxRecord]:
    return APICall("GET", f"/sandbox/v1/sandboxes/{path_id(sandbox_id)}", parse_object(SandboxRecord))


def records_call(state: str | None) -> APICall[ObjectList[SandboxRecord]]:
    params = drop_none({"state": state}) or None
    return APICall("GET", "/sandbox/v1/sandboxes", parse_list(SandboxRecord), params=params)


def kill_call(sandbox_id: str) -> APICall[None]:
    return APICall("DELETE", f"/sandbox/sandboxes/{path_id(sandbox_id)}", lambda r: None)


def timeout_call(sandbox_id: str, seconds: int) -> APICall[None]:
    return APICall("POST", f"/sandbox/sandboxes/{path_id(sandbox_id)}/timeout", lambda r: None,
                   json={"timeout": int(seconds)})


# ---- the daemon: files and filesystem RPCs ------------------------------------------------


def _entry(data: Any) -> SandboxEntry:
    if isinstance(data, dict):
        kind = str(data.get("type", ""))
        data = {**data, "type": "dir" if kind in ("FILE_TYPE_DIRECTORY", "directory", "dir") else "file"}
    return SandboxEntry.model_validate(data)


def _json_of(response: httpx.Response) -> Any:
    try:
        return response.json() if response.content else {}
    except ValueError as exc:
        raise APIResponseValidationError(f"expected JSON from {response.request.url.path}", response=response) from exc


def read_call(path: str) -> APICall[bytes]:
    return APICall("GET", "/sandbox/envd/files", lambda r: r.content, params={"path": path})


def write_call(path: str, data: str | bytes) -> APICall[SandboxEntry]:
    def parse(response: httpx.Response) -> SandboxEntry:
        written = _json_of(response)
        if not isinstance(written, list) or not written:
            raise APIResponseValidationError("expected the written file's entry", response=response)
        return _entry(written[0])

    content = data.encode() if isinstance(data, str) else bytes(data)
    return APICall("POST", "/sandbox/envd/files", parse, params={"path": path}, content=content,
                   content_type="application/octet-stream")


def fs_call(method: str, body: dict[str, Any], parse: Callable[[Any], Any]) -> APICall[Any]:
    return APICall("POST", f"/sandbox/envd/filesystem.Filesystem/{method}", lambda r: parse(_json_of(r)),
                   content=json.dumps(body).encode(), content_type="application/json")


def list_call(path: str, depth: int) -> APICall[list[SandboxEntry]]:
    return fs_call("ListDir", {"path": path, "depth": depth}, lambda b: [_entry(e) for e in b.get("entries", [])])


def stat_call(path: str) -> APICall[SandboxEntry]:
    return fs_call("Stat", {"path": path}, lambda b: _entry(b.get("entry")))


def make_dir_call(path: str) -> APICall[SandboxEntry]:
    return fs_call("MakeDir", {"path": path}, lambda b: _entry(b.get("entry")))


def move_call(source: str, destination: str) -> APICall[SandboxEntry]:
    return fs_call("Move", {"source": source, "destination": destination}, lambda b: _entry(b.get("entry")))


def remove_call(path: str) -> APICall[None]:
    return fs_call("Remove", {"path": path}, lambda b: None)


def signal_call(pid: int, signal: str = "SIGNAL_SIGKILL") -> APICall[None]:
    return APICall("POST", "/sandbox/envd/process.Process/SendSignal", lambda r: None,
                   content=json.dumps({"process": {"pid": pid}, "signal": signal}).encode(),
                   content_type="application/json")


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def start_call(cmd: str, envs: Mapping[str, str] | None, cwd: str | None) -> APICall[None]:
    process = drop_none({"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": dict(envs or {}), "cwd": cwd})
    return APICall("POST", "/sandbox/envd/process.Process/Start", content=envelope({"process": process}),
                   content_type=CONNECT_STREAM)


# ---- sending daemon calls -------------------------------------------------------------------


class _DaemonView:
    """The client, seen through one sandbox: every request also names the sandbox
    (``E2b-Sandbox-Id``) and may carry its own timeout.

    ``APICall`` has no per-call headers, so the client's own send loop (retries, error
    mapping) is run on this view, which changes only how requests are built.
    """

    def __init__(self, client: BaseClient, sandbox_id: str, timeout: httpx.Timeout | None = None) -> None:
        self._client, self._sandbox_id, self._timeout = client, sandbox_id, timeout

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _build_request(self, http: Any, call: APICall[Any], *, stream: bool) -> httpx.Request:
        request = self._client._build_request(http, call, stream=stream)
        request.headers[SANDBOX_HEADER] = self._sandbox_id
        if call.content_type == CONNECT_STREAM:
            request.headers["Accept"] = CONNECT_STREAM
        if self._timeout is not None:
            request.extensions["timeout"] = self._timeout.as_dict()
        return request


def _command_timeout(client: BaseClient, seconds: float | None) -> httpx.Timeout:
    """The client's timeouts, except that reading waits as long as the command may run."""
    base = httpx.Timeout(client.timeout)
    return httpx.Timeout(connect=base.connect, read=seconds, write=base.write, pool=base.pool)


def _sync_send(client: SyncAPIClient, sandbox_id: str, call: APICall[Any], *, stream: bool = False,
               timeout: httpx.Timeout | None = None) -> httpx.Response:
    view = _DaemonView(client, sandbox_id, timeout)
    return type(client)._send(view, call, stream=stream)  # type: ignore[arg-type]


async def _async_send(client: AsyncAPIClient, sandbox_id: str, call: APICall[Any], *, stream: bool = False,
                      timeout: httpx.Timeout | None = None) -> httpx.Response:
    view = _DaemonView(client, sandbox_id, timeout)
    return await type(client)._send(view, call, stream=stream)  # type: ignore[arg-type]


# ---- decoding a command's output stream ------------------------------------------------------


class EnvelopeDecoder:
    """Splits a Connect stream, fed in arbitrary pieces, into ``(flags, json)`` messages."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[tuple[int, Any]]:
        self._buffer += chunk
        out: list[tuple[int, Any]] = []
        while len(self._buffer) >= 5:
            flags, size = struct.unpack(">BI", self._buffer[:5])
            if len(self._buffer) < 5 + size:
                break
            raw, self._buffer = self._buffer[5:5 + size], self._buffer[5 + size:]
            if flags & 0x01:
                raise APIConnectionError("the sandbox sent a compressed message, which this SDK does not decode")
            try:
                out.append((flags, json.loads(raw) if raw else {}))
            except ValueError as exc:
                raise APIConnectionError(f"the sandbox sent a malformed message: {raw[:200]!r}") from exc
        return out

    @property
    def pending(self) -> bool:
        return bool(self._buffer)


def connect_error(error: Any, response: httpx.Response) -> APIStatusError:
    """The SDK's exception for a Connect ``{"code", "message"}`` error sent inside a 200 stream."""
    error = error if isinstance(error, dict) else {}
    code = str(error.get("code") or "internal")
    message = str(error.get("message") or code)
    status = _CONNECT_STATUS.get(code, 500)
    if code == "resource_exhausted" and "budget" in message.lower():
        status = 402
    return error_from_body({"error": {"type": code, "message": message}, "status_code": status}, response)


class CommandOutput:
    """Collects a command's stream: text to the callbacks as it arrives, then the result."""

    def __init__(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None) -> None:
        self.decoder = EnvelopeDecoder()
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self.text: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.utf8 = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in self.text}
        self.pid: int | None = None
        self.end: dict[str, Any] | None = None
        self.finished = False

    def _emit(self, name: str, text: str) -> None:
        if text:
            self.text[name].append(text)
            callback = self.callbacks[name]
            if callback is not None:
                callback(text)

    def feed(self, chunk: bytes, response: httpx.Response) -> None:
        for flags, message in self.decoder.feed(chunk):
            if flags & END_STREAM:
                self.finished = True
                if isinstance(message, dict) and message.get("error"):
                    raise connect_error(message["error"], response)
                continue
            event = message.get("event", {}) if isinstance(message, dict) else {}
            if "start" in event:
                self.pid = event["start"].get("pid")
            elif "data" in event:
                for name, data in event["data"].items():
                    if name in self.text and data:
                        self._emit(name, self.utf8[name].decode(base64.b64decode(data)))
            elif "end" in event:
                self.end = event["end"]

    def result(self) -> CommandResult:
        for name, decoder in self.utf8.items():
            self._emit(name, decoder.decode(b"", final=True))
        if self.end is None:
            raise APIConnectionError("the command's output stream ended before the command did")
        return CommandResult(stdout="".join(self.text["stdout"]), stderr="".join(self.text["stderr"]),
                             exit_code=int(self.end.get("exitCode", 0)), status=self.end.get("status"),
                             pid=self.pid)


def _timed_out(seconds: float) -> APITimeoutError:
    return APITimeoutError(f"the command did not finish within {seconds:g} s and was killed")


# ---- sync handles --------------------------------------------------------------------------


class SandboxFiles:
    """``sbx.files``: the sandbox's filesystem. Relative paths are relative to /home/user."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def _do(self, call: APICall[Any]) -> Any:
        sbx = self._sandbox
        return call.parse(_sync_send(sbx._client, sbx.id, call))  # type: ignore[misc]

    @overload
    def read(self, path: str, *, text: Literal[True] = True) -> str: ...
    @overload
    def read(self, path: str, *, text: Literal[False]) -> bytes: ...

    def read(self, path: str, *, text: bool = True) -> str | bytes:
        """A file's content: ``str`` (UTF-8) by default, ``bytes`` with ``text=False``."""
        data: bytes = self._do(read_call(path))
        return data.decode() if text else data

    def write(self, path: str, data: str | bytes) -> SandboxEntry:
        """Create or overwrite a file (and its missing parent directories)."""
        return self._do(write_call(path, data))

    def list(self, path: str = HOME, depth: int = 1) -> builtins.list[SandboxEntry]:
        """Entries under ``path``, ``depth`` levels deep."""
        return self._do(list_call(path, depth))

    def stat(self, path: str) -> SandboxEntry:
        return self._do(stat_call(path))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except NotFoundError:
            return False
        return True

    def make_dir(self, path: str) -> bool:
        """Create a directory (and its parents); False if it already existed."""
        try:
            self._do(make_dir_call(path))
        except ConflictError:
            return False
        return True

    def rename(self, source: str, destination: str) -> SandboxEntry:
        return self._do(move_call(source, destination))

    def remove(self, path: str) -> None:
        """Remove a file or a directory tree (NotFoundError if it is not there)."""
        self._do(remove_call(path))


class Sandbox:
    """A live sandbox. ``with`` kills it when the block ends."""

    def __init__(self, client: SyncAPIClient, sandbox_id: str, template: str | None = None) -> None:
        self._client = client
        self.id = sandbox_id
        self.template = template
        self.files = SandboxFiles(self)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, template={self.template!r})"

    def run(self, cmd: str, *, envs: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, on_stdout: OutputCallback | None = None,
            on_stderr: OutputCallback | None = None) -> CommandResult:
        """Run ``cmd`` with ``bash -l -c`` and wait for it.

        Output is passed to the callbacks as it arrives and collected in the result; a
        non-zero exit code is returned, not raised (a command killed by signal N has
        ``exit_code == -N``; one whose sandbox ended under it has ``-1`` and ``status``
        ``"sandbox ended"``: :meth:`info` says why). With ``timeout`` (seconds) a command
        still running then is killed and :class:`~rsigym.APITimeoutError` is raised.
        """
        output = CommandOutput(on_stdout, on_stderr)
        deadline = None if timeout is None else time.monotonic() + timeout
        response = _sync_send(self._client, self.id, start_call(cmd, envs, cwd), stream=True,
                              timeout=_command_timeout(self._client, timeout))
        try:
            for chunk in response.iter_raw():
                output.feed(chunk, response)
                if deadline is not None and time.monotonic() > deadline and output.end is None:
                    raise httpx.ReadTimeout("command deadline", request=response.request)
        except httpx.ReadTimeout as exc:
            if timeout is None:
                raise error_from_transport(exc) from exc
            if output.pid is not None:
                response.close()
                self._kill_process(output.pid)
            raise _timed_out(timeout) from exc
        except httpx.TransportError as exc:
            raise error_from_transport(exc) from exc
        finally:
            response.close()
        return output.result()

    def _kill_process(self, pid: int) -> None:
        try:
            _sync_send(self._client, self.id, signal_call(pid))
        except NotFoundError:
            pass

    def set_timeout(self, seconds: int) -> None:
        """Kill the sandbox ``seconds`` from now (instead of when its timeout said)."""
        self._client._request(timeout_call(self.id, seconds))

    def info(self) -> SandboxRecord:
        """The gym's record: state, end reason, seconds and cost so far (also after it ended)."""
        return self._client._request(record_call(self.id))

    def is_running(self) -> bool:
        return self.info().running

    def kill(self) -> bool:
        """Kill the sandbox; False if it had already ended."""
        try:
            self._client._request(kill_call(self.id))
        except NotFoundError:
            return False
        return True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()


class Sandboxes(SyncResource):
    def create(self, template: str | None = None, *, timeout: int | None = None,
               metadata: Mapping[str, str] | None = None, envs: Mapping[str, str] | None = None,
               internet: bool | None = None) -> Sandbox:
        """Start a sandbox; it is killed after ``timeout`` seconds (default: the gym's, 300)
        unless :meth:`Sandbox.set_timeout` moves that. ``internet=True`` needs a key whose
        policy grants it (403 otherwise)."""
        sandbox_id, template_id = self._client._request(create_call(template, timeout, metadata, envs, internet))
        return Sandbox(self._client, sandbox_id, template_id or template)

    def connect(self, sandbox_id: str) -> Sandbox:
        """A handle on a running sandbox of this run (NotFoundError if it is not running)."""
        _, template = self._client._request(detail_call(sandbox_id))
        return Sandbox(self._client, sandbox_id, template or None)

    def list(self, *, state: str | None = None) -> ObjectList[SandboxRecord]:
        """This run's sandboxes, newest first, ended ones included unless ``state`` narrows it."""
        return self._client._request(records_call(state))

    def get(self, sandbox_id: str) -> SandboxRecord:
        return self._client._request(record_call(sandbox_id))

    def kill(self, sandbox_id: str) -> bool:
        return Sandbox(self._client, sandbox_id).kill()


# ---- async handles -------------------------------------------------------------------------


class AsyncSandboxFiles:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def _do(self, call: APICall[Any]) -> Any:
        sbx = self._sandbox
        return call.parse(await _async_send(sbx._client, sbx.id, call))  # type: ignore[misc]

    @overload
    async def read(self, path: str, *, text: Literal[True] = True) -> str: ...
    @overload
    async def read(self, path: str, *, text: Literal[False]) -> bytes: ...

    async def read(self, path: str, *, text: bool = True) -> str | bytes:
        data: bytes = await self._do(read_call(path))
        return data.decode() if text else data

    async def write(self, path: str, data: str | bytes) -> SandboxEntry:
        return await self._do(write_call(path, data))

    async def list(self, path: str = HOME, depth: int = 1) -> builtins.list[SandboxEntry]:
        return await self._do(list_call(path, depth))

    async def stat(self, path: str) -> SandboxEntry:
        return await self._do(stat_call(path))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFoundError:
            return False
        return True

    async def make_dir(self, path: str) -> bool:
        try:
            await self._do(make_dir_call(path))
        except ConflictError:
            return False
        return True

    async def rename(self, source: str, destination: str) -> SandboxEntry:
        return await self._do(move_call(source, destination))

    async def remove(self, path: str) -> None:
        await self._do(remove_call(path))


class AsyncSandbox:
    """Asyncio twin of :class:`Sandbox`: ``async with await gym.sandbox.create() as sbx:``."""

    def __init__(self, client: AsyncAPIClient, sandbox_id: str, template: str | None = None) -> None:
        self._client = client
        self.id = sandbox_id
        self.template = template
        self.files = AsyncSandboxFiles(self)

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, template={self.template!r})"

    async def run(self, cmd: str, *, envs: Mapping[str, str] | None = None, cwd: str | None = None,
                  timeout: float | None = None, on_stdout: OutputCallback | None = None,
                  on_stderr: OutputCallback | None = None) -> CommandResult:
        """See :meth:`Sandbox.run` (the callbacks are plain functions, called as output arrives)."""
        output = CommandOutput(on_stdout, on_stderr)
        deadline = None if timeout is None else time.monotonic() + timeout
        response = await _async_send(self._client, self.id, start_call(cmd, envs, cwd), stream=True,
                                     timeout=_command_timeout(self._client, timeout))
        try:
            async for chunk in response.aiter_raw():
                output.feed(chunk, response)
                if deadline is not None and time.monotonic() > deadline and output.end is None:
                    raise httpx.ReadTimeout("command deadline", request=response.request)
        except httpx.ReadTimeout as exc:
            if timeout is None:
                raise error_from_transport(exc) from exc
            if output.pid is not None:
                await response.aclose()
                try:
                    await _async_send(self._client, self.id, signal_call(output.pid))
                except NotFoundError:
                    pass
            raise _timed_out(timeout) from exc
        except httpx.TransportError as exc:
            raise error_from_transport(exc) from exc
        finally:
            await response.aclose()
        return output.result()

    async def set_timeout(self, seconds: int) -> None:
        await self._client._request(timeout_call(self.id, seconds))

    async def info(self) -> SandboxRecord:
        return await self._client._request(record_call(self.id))

    async def is_running(self) -> bool:
        return (await self.info()).running

    async def kill(self) -> bool:
        try:
            await self._client._request(kill_call(self.id))
        except NotFoundError:
            return False
        return True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.kill()


class AsyncSandboxes(AsyncResource):
    async def create(self, template: str | None = None, *, timeout: int | None = None,
                     metadata: Mapping[str, str] | None = None, envs: Mapping[str, str] | None = None,
                     internet: bool | None = None) -> AsyncSandbox:
        sandbox_id, template_id = await self._client._request(create_call(template, timeout, metadata, envs, internet))
        return AsyncSandbox(self._client, sandbox_id, template_id or template)

    async def connect(self, sandbox_id: str) -> AsyncSandbox:
        _, template = await self._client._request(detail_call(sandbox_id))
        return AsyncSandbox(self._client, sandbox_id, template or None)

    async def list(self, *, state: str | None = None) -> ObjectList[SandboxRecord]:
        return await self._client._request(records_call(state))

    async def get(self, sandbox_id: str) -> SandboxRecord:
        return await self._client._request(record_call(sandbox_id))

    async def kill(self, sandbox_id: str) -> bool:
        return await AsyncSandbox(self._client, sandbox_id).kill()
