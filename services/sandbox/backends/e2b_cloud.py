"""Sandboxes on E2B's cloud: the scale backend, driven with the e2b SDK and the platform's key.

Agents never reach E2B: they speak E2B's protocol to the gym (api.py, envd.py), and this
backend carries out each agent-protocol request (backends/base.py) on a sandbox in E2B's
cloud with the *platform's* ``E2B_API_KEY`` (ProviderSecrets), never anything an agent sent.
API URL and domain come from the gym config, never from the process environment.

Ownership: every E2B sandbox is created with owner metadata (``rsigym_run``,
``rsigym_sandbox``) that the agent's own metadata cannot override. Before a sandbox is used
or killed, its metadata in E2B must name this run and this gym sandbox (checked on first
use, then cached); a mismatch is refused as not found and logged, and a sandbox that is not
ours is never killed.

Network follows the key's policy: without internet a sandbox gets
``allow_internet_access=False`` plus an egress deny-all, and no sandbox's ports are public.

Timeouts: the gym ends sandboxes itself (its own timeout can be extended later), so an E2B
sandbox is created with at most one lease of time and ``alive()`` (polled by the service's
supervisor, throttled here) renews the lease while the gym still wants the sandbox. If the
gym dies, its sandboxes end within one lease.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import shlex
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b import AsyncSandbox, CommandExitException, Sandbox, SandboxNetworkOpts
from e2b.exceptions import (
    AuthenticationException,
    FileNotFoundException,
    InvalidArgumentException,
    NotEnoughSpaceException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxNotRunningException,
    SandboxUnreachableException,
    ServiceBusyException,
    TimeoutException,
)
from e2b.sandbox.filesystem.filesystem import EntryInfo, FileType
from e2b.sandbox.network import ALL_TRAFFIC

from kit.errors import (
    GymError,
    NotFound,
    ServiceUnavailable,
    Unprocessable,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamTimeout,
)
from kit.spec import ServiceContext
from services.sandbox.backends.base import STREAM_EVENTS, SandboxSpec

log = logging.getLogger("rsigym.sandbox")

KEY_ENV = "E2B_API_KEY"
RUN_KEY = "rsigym_run"
SANDBOX_KEY = "rsigym_sandbox"
RESERVED_PREFIX = "rsigym_"
"""Metadata keys the gym stamps; an agent's keys with this prefix are dropped."""
READ_LIMIT = 64 * 1024 * 1024


@dataclass
class _Cloud:
    spec: SandboxSpec
    e2b_id: str
    verified: bool = False
    """Its metadata in E2B was seen to name this run and this gym sandbox."""
    foreign: bool = False
    """Its metadata named someone else: refused, never used or killed."""
    gone: bool = False
    handle: AsyncSandbox | None = None
    checked_at: float = 0.0


class E2BCloudBackend:
    name = "e2b"

    def __init__(self, api_key: str, *, api_url: str, domain: str, sandbox_url: str | None = None,
                 request_timeout_s: float = 60.0, check_every_s: float = 30.0, lease_s: int = 600,
                 renew_within_s: float = 180.0):
        if not api_key:
            raise ServiceUnavailable(f"the e2b sandbox backend needs the platform's {KEY_ENV}")
        self._opts: dict[str, Any] = {"api_key": api_key, "api_url": api_url, "domain": domain, "debug": False,
                                      "request_timeout": request_timeout_s, "http_version": "2"}
        if sandbox_url:
            self._opts["sandbox_url"] = sandbox_url
        self.check_every_s, self.lease_s, self.renew_within_s = check_every_s, lease_s, renew_within_s
        self._sandboxes: dict[str, _Cloud] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_context(cls, context: ServiceContext) -> E2BCloudBackend:
        key = context.secrets.get(KEY_ENV)
        if not key:
            raise ServiceUnavailable(
                f"sandbox.backend is 'e2b' but the platform's {KEY_ENV} is not set in the gym's environment")
        cfg = context.config.sandbox
        return cls(key, api_url=cfg.e2b_api_url, domain=cfg.e2b_domain,
                   sandbox_url=getattr(cfg, "e2b_sandbox_url", None))

    # -- lifecycle ---------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> str:
        if not spec.owner:
            raise Unprocessable("a cloud sandbox needs the run that owns it")
        if spec.door_port is not None:
            raise Unprocessable("sandboxes on the e2b backend have no model door; this needs the local backend")
        metadata = {k: v for k, v in spec.metadata.items() if not k.startswith(RESERVED_PREFIX)}
        metadata.update({RUN_KEY: spec.owner, SANDBOX_KEY: spec.sandbox_id})
        network: SandboxNetworkOpts = {"allow_public_traffic": False}
        if not spec.internet:
            network["deny_out"] = [ALL_TRAFFIC]
        template = spec.template.e2b_template or spec.template.name
        try:
            sandbox = Sandbox.create(
                template=template, timeout=min(spec.timeout_s, self.lease_s), metadata=metadata, envs=dict(spec.envs),
                allow_internet_access=spec.internet, network=network, lifecycle={"on_timeout": "kill"},
                idempotency_key=re.sub(r"[^a-z0-9-]", "-", f"rsigym-{spec.sandbox_id}".lower()), **self._opts,
            )
        except Exception as err:  # noqa: BLE001 - the SDK's errors, mapped to the gym's
            raise _gym_error(err, f"creating a sandbox from template {template!r}", param="templateID") from None
        with self._lock:
            self._sandboxes[spec.sandbox_id] = _Cloud(spec, sandbox.sandbox_id, checked_at=time.monotonic())
        log.info("sandbox %s is E2B sandbox %s (template %s)", spec.sandbox_id, sandbox.sandbox_id, template)
        return sandbox.sandbox_id

    def make_dirs(self, sandbox_id: str, dirs: list[tuple[str, int | None]]) -> list[str]:
        """One command in the new sandbox (E2B's daemon makes a directory but sets no mode): for
        each directory, the number of each of it and its parents that is absent (the numbers
        index ``named``), then ``mkdir -p`` and its ``chmod``; it stops at the first that fails."""
        cloud = self._sandboxes.get(sandbox_id)
        if cloud is None:
            raise NotFound(f"sandbox {sandbox_id} is not running")
        named: list[str] = []
        lines = []
        for path, mode in dirs:
            parts = path.strip("/").split("/")
            for depth in range(1, len(parts) + 1):
                named.append("/" + "/".join(parts[:depth]))
                lines.append(f"[ -e {shlex.quote(named[-1])} ] || echo {len(named) - 1}")
            quoted = shlex.quote(path)
            lines.append(f"mkdir -p -- {quoted} || exit 1")
            if mode is not None:
                lines.append(f"chmod {mode:o} -- {quoted} || exit 1")
        try:
            result = Sandbox.connect(cloud.e2b_id, **self._opts).commands.run("\n".join(lines), timeout=60)
        except CommandExitException as err:
            raise Unprocessable(f"could not make the sandbox's directories: {err.stderr.strip()[-500:]}",
                                param="rsigymDirs") from None
        except Exception as err:  # noqa: BLE001 - the SDK's errors, mapped to the gym's
            raise _gym_error(err, f"making the directories of sandbox {sandbox_id}", param="rsigymDirs") from None
        return [named[int(i)] for i in result.stdout.split()]

    def kill(self, sandbox_id: str) -> None:
        cloud = self._sandboxes.get(sandbox_id)
        if cloud is None:
            return
        if not (cloud.gone or cloud.foreign):
            try:
                if not cloud.verified:
                    self._check_owner(cloud, Sandbox.get_info(cloud.e2b_id, **self._opts).metadata)
                if cloud.verified:
                    Sandbox.kill(cloud.e2b_id, **self._opts)  # False: already gone
            except NotFoundException:
                pass
            except Exception as err:  # noqa: BLE001 - keep it: close() tries again; E2B's timeout ends it anyway
                raise _gym_error(err, f"killing sandbox {sandbox_id}") from None
        with self._lock:
            self._sandboxes.pop(sandbox_id, None)

    def alive(self, sandbox_id: str) -> bool:
        """Cached; asks E2B at most every ``check_every_s`` and renews its timeout when due."""
        cloud = self._sandboxes.get(sandbox_id)
        if cloud is None or cloud.gone or cloud.foreign:
            return False
        now = time.monotonic()
        if now - cloud.checked_at < self.check_every_s:
            return True
        cloud.checked_at = now
        try:
            info = Sandbox.get_info(cloud.e2b_id, **{**self._opts, "request_timeout": 10.0})
            if not self._check_owner(cloud, info.metadata):
                return False
            if str(getattr(info.state, "value", info.state)) != "running":
                cloud.gone = True
                return False
            end_at = info.end_at if info.end_at.tzinfo else info.end_at.replace(tzinfo=UTC)
            if (end_at - datetime.now(UTC)).total_seconds() < self.renew_within_s:
                Sandbox.set_timeout(cloud.e2b_id, self.lease_s, **self._opts)
        except NotFoundException:
            cloud.gone = True
            return False
        except Exception as err:  # noqa: BLE001 - E2B unreachable for a moment: the next check asks again
            log.warning("sandbox %s: could not check E2B sandbox %s: %s", sandbox_id, cloud.e2b_id, err)
        return True

    def door_path(self, sandbox_id: str) -> str | None:
        return None

    def close(self) -> None:
        for sandbox_id in list(self._sandboxes):
            try:
                self.kill(sandbox_id)
            except GymError as err:
                log.warning("sandbox %s: %s", sandbox_id, err.message)

    def _check_owner(self, cloud: _Cloud, metadata: dict[str, str] | None) -> bool:
        metadata = metadata or {}
        if metadata.get(SANDBOX_KEY) == cloud.spec.sandbox_id and metadata.get(RUN_KEY) == cloud.spec.owner:
            cloud.verified = True
            return True
        cloud.foreign = True
        log.warning("sandbox %s (run %s): E2B sandbox %s names run %r, sandbox %r; refused",
                    cloud.spec.sandbox_id, cloud.spec.owner, cloud.e2b_id, metadata.get(RUN_KEY),
                    metadata.get(SANDBOX_KEY))
        return False

    # -- agent protocol ----------------------------------------------------------------

    async def _connected(self, sandbox_id: str) -> tuple[_Cloud, AsyncSandbox]:
        cloud = self._sandboxes.get(sandbox_id)
        if cloud is not None and cloud.handle is None and not (cloud.gone or cloud.foreign):
            try:
                if cloud.verified or self._check_owner(cloud, (await AsyncSandbox.get_info(
                        cloud.e2b_id, **self._opts)).metadata):
                    cloud.handle = await AsyncSandbox.connect(cloud.e2b_id, **self._opts)
            except NotFoundException:
                cloud.gone = True
            except Exception as err:  # noqa: BLE001 - the SDK's errors, mapped to the gym's
                raise _gym_error(err, f"connecting to sandbox {sandbox_id}") from None
        if cloud is None or cloud.handle is None or cloud.gone or cloud.foreign:
            raise NotFound(f"sandbox {sandbox_id} is not running")
        return cloud, cloud.handle

    async def call(self, sandbox_id: str, request: dict[str, Any]) -> dict[str, Any]:
        cloud, sandbox = await self._connected(sandbox_id)
        try:
            return await _call(sandbox, request)
        except (KeyError, TypeError, ValueError) as err:  # a malformed request (binascii.Error is a ValueError)
            return _err("invalid_argument", f"bad request: {err}")
        except Exception as err:  # noqa: BLE001 - the SDK's errors become agent-protocol errors
            return _agent_error(cloud, err)

    async def stream(self, sandbox_id: str, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        cloud, sandbox = await self._connected(sandbox_id)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(STREAM_EVENTS)

        def output(name: str) -> Callable[[str], Awaitable[None]]:
            async def put(text: str) -> None:  # awaited by the SDK: a slow reader slows the relay down
                await queue.put({name: _b64(text.encode())})
            return put

        callbacks: dict[str, Any] = {"on_stdout": output("stdout"), "on_stderr": output("stderr"),
                                     "timeout": 0, "retain_output": False}
        try:
            if request.get("op") == "start":
                handle = await sandbox.commands.run(
                    _command_line(request), background=True, envs={str(k): str(v) for k, v in
                                                                    (request.get("envs") or {}).items()},
                    cwd=request.get("cwd") or None, stdin=bool(request.get("stdin")), **callbacks)
            elif request.get("op") == "connect":
                handle = await sandbox.commands.connect(int(request["pid"]), **callbacks)
            else:
                yield _err("invalid_argument", f"{request.get('op')!r} does not stream")
                return
        except (KeyError, TypeError, ValueError) as err:
            yield _err("invalid_argument", f"bad request: {err}")
            return
        except Exception as err:  # noqa: BLE001 - the SDK's errors become agent-protocol errors
            yield _agent_error(cloud, err)
            return
        yield {"start": {"pid": handle.pid}}
        waiter = asyncio.ensure_future(_finish(handle, queue, lambda err: _agent_error(cloud, err)))
        try:
            while True:
                event = await queue.get()
                yield event
                if "end" in event or "error" in event:
                    return
        finally:
            if not waiter.done():  # the caller went away: stop listening, leave the process running
                waiter.cancel()
                await handle.disconnect()


async def _call(sandbox: AsyncSandbox, req: dict[str, Any]) -> dict[str, Any]:
    op, path = req.get("op"), str(req.get("path", ""))
    files, commands = sandbox.files, sandbox.commands
    if op == "read":
        limit = int(req.get("limit", READ_LIMIT))
        info = await files.get_info(path)
        if info.type == FileType.DIR:
            return _err("invalid_argument", f"path is a directory: {path}")
        data = bytes(await files.read(path, format="bytes")) if info.size <= limit else b""
        if info.size > limit or len(data) > limit:
            return _err("resource_exhausted", f"file over {limit} bytes: {path}")
        return {"data": _b64(data)}
    if op == "write":
        written = await files.write(path, base64.b64decode(req.get("data", ""), validate=True))
        return {"entry": _entry(await files.get_info(written.path))}
    if op == "stat":
        return {"entry": _entry(await files.get_info(path))}
    if op == "listdir":
        return {"entries": [_entry(e) for e in await files.list(path, depth=max(1, int(req.get("depth", 1))))]}
    if op == "mkdir":
        created = await files.make_dir(path)
        return {"created": created, "entry": _entry(await files.get_info(path))}
    if op == "remove":
        await files.remove(path)
        return {"ok": True}
    if op == "rename":
        return {"entry": _entry(await files.rename(path, str(req["destination"])))}
    if op == "list":
        return {"processes": [{"pid": p.pid, "tag": p.tag, "cmd": p.cmd, "args": p.args, "envs": p.envs,
                               "cwd": p.cwd} for p in await commands.list()]}
    if op == "signal":  # E2B's SDK sends only SIGKILL
        pid = int(req["pid"])
        return {"ok": True} if await commands.kill(pid) else _err("not_found", f"process {pid} not found")
    if op == "input":
        await commands.send_stdin(int(req["pid"]), base64.b64decode(req.get("data", ""), validate=True))
        return {"ok": True}
    if op == "close_stdin":
        await commands.close_stdin(int(req["pid"]))
        return {"ok": True}
    if op == "ping":
        return {"ok": True} if await sandbox.is_running() else _err("not_found", "the sandbox is not running")
    return _err("unimplemented", f"unknown operation {op!r}")


async def _finish(handle: Any, queue: asyncio.Queue[dict[str, Any]],
                  to_error: Callable[[BaseException], dict[str, Any]]) -> None:
    """Wait for the process; its end (or what went wrong) is the stream's last event."""
    try:
        result = await handle.wait()
        code, error = result.exit_code, result.error
    except CommandExitException as exc:
        code, error = exc.exit_code, exc.error
    except Exception as exc:  # noqa: BLE001 - the stream broke before the process ended
        await queue.put(to_error(exc))
        return
    status = error if error and error.startswith("signal") else f"exit status {code}"
    await queue.put({"end": {"exit_code": code, "status": status, **({"error": error} if error else {})}})


def _command_line(req: dict[str, Any]) -> str:
    """E2B runs commands as ``/bin/bash -l -c LINE``: unwrap what the agent's SDK wrapped the
    same way; run anything else exactly as given."""
    cmd, args = str(req["cmd"]), [str(a) for a in req.get("args") or []]
    if cmd in ("/bin/bash", "bash") and len(args) == 3 and args[:2] == ["-l", "-c"]:
        return args[2]
    return "exec " + shlex.join([cmd, *args])


def _entry(e: EntryInfo) -> dict[str, Any]:
    return {
        "name": e.name, "type": "directory" if e.type == FileType.DIR else "file", "path": e.path, "size": e.size,
        "mode": e.mode, "permissions": e.permissions, "owner": e.owner, "group": e.group,
        "modified_time": e.modified_time.timestamp() if e.modified_time else 0.0, "symlink_target": e.symlink_target,
    }


def _err(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


_SDK_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    ((FileNotFoundException, NotFoundException), "not_found"),
    (InvalidArgumentException, "invalid_argument"),
    ((NotEnoughSpaceException, RateLimitException), "resource_exhausted"),
    ((SandboxUnreachableException, ServiceBusyException), "unavailable"),
    ((TimeoutException, httpx.TimeoutException), "deadline_exceeded"),
    ((httpx.HTTPError, OSError), "unavailable"),
)
_STATUS_CODES = {400: "invalid_argument", 403: "permission_denied", 404: "not_found", 409: "already_exists",
                 507: "resource_exhausted"}


def _agent_error(cloud: _Cloud, err: BaseException) -> dict[str, Any]:
    """An SDK exception as the agent protocol's error: the envd code where E2B sent one, else
    by exception type. E2B's sandbox id never reaches the agent; a refusal of the gym's own
    credentials is the gym's problem, not a credential error of the agent's."""
    message = str(err) or type(err).__name__
    code = None
    if isinstance(err, AuthenticationException):
        code, message = "unavailable", "E2B refused the gym's credentials"
    elif isinstance(err, SandboxNotRunningException):
        code, message = "not_found", "the sandbox is not running"
        cloud.checked_at = 0.0  # the next alive() asks E2B at once
    elif (rpc := _connect_error(err)) is not None and rpc.code is not Code.UNAUTHENTICATED:
        code, message = rpc.code.value, rpc.message
    if code is None:
        code = next((c for cls, c in _SDK_CODES if isinstance(err, cls)), None)
    if code is None:
        code = _STATUS_CODES.get(getattr(err, "status_code", None) or 0, "internal")
    return _err(code, message.replace(cloud.e2b_id, cloud.spec.sandbox_id))


def _connect_error(err: BaseException) -> ConnectError | None:
    """The envd RPC error the SDK translated (it raises its own exception inside ``except``)."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None or isinstance(seen, ConnectError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _gym_error(err: BaseException, doing: str, *, param: str | None = None) -> GymError:
    """A control-plane failure as the gym's error (the platform's account, not the agent's)."""
    if isinstance(err, GymError):
        return err
    if isinstance(err, AuthenticationException):
        return ServiceUnavailable(f"E2B refused the gym's API key while {doing}")
    if isinstance(err, RateLimitException):
        return UpstreamRateLimited(f"E2B is rate limiting the gym ({doing}); try again shortly")
    if isinstance(err, ServiceBusyException):
        return ServiceUnavailable(f"E2B has no capacity right now ({doing}); try again shortly")
    if isinstance(err, (TimeoutException, httpx.TimeoutException, TimeoutError)):
        return UpstreamTimeout(f"E2B did not answer in time ({doing})")
    if isinstance(err, (InvalidArgumentException, NotFoundException)) or (
            isinstance(err, SandboxException) and err.status_code in (400, 404)):
        return Unprocessable(f"E2B refused {doing}: {err}", param=param)
    return UpstreamError(f"E2B failed while {doing}: {err}")
