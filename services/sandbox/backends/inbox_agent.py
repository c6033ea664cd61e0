"""The agent that runs *inside* a local sandbox and does the sandbox's work there.

It is started as the sandbox's first process (inside bubblewrap, as the sandbox's own
unprivileged uid, after the limits were set) and listens on a Unix socket that the sandbox
service reaches through a bind mount. Everything a client asks — start a process, stream
its output, signal it, read or write a file — happens here, with exactly the sandbox's
privileges and view of the filesystem, so the host never follows a path the sandbox
controls. The agent holds nothing secret; sandboxed code may talk to it too.

Stdlib only and Python 3.9+: it runs on whatever interpreter the template provides.

Protocol: one JSON request per connection (a line), answered by JSON lines; binary data is
base64. ``start`` and ``connect`` stream events until the process ends.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import os
import shutil
import signal
import stat
import sys
from typing import Any

CHUNK = 32 * 1024
MAX_LINE = 96 * 1024 * 1024
STREAM_EVENTS = 64
"""Output events held per subscriber (services/sandbox/backends/base.py has the same number): a
subscriber that does not read makes the pump wait, so the process blocks writing its pipe."""


class Proc:
    def __init__(self, pid: int, request: dict[str, Any], process: asyncio.subprocess.Process):
        self.pid, self.request, self.process = pid, request, process
        self.subscribers: list[asyncio.Queue[dict[str, Any]]] = []
        self.done = False
        self.watcher: asyncio.Future[None] | None = None  # held here: the loop keeps only a weak reference


PROCS: dict[int, Proc] = {}
BASE_ENV: dict[str, str] = {}
PENDING = {"configure": False}
"""A warm-pool agent (``--await-configure``) serves nothing but ``ping`` and one ``configure``
(the claiming sandbox's id, environment and door forward) until the service claims it."""


def _err(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _entry(path: str) -> dict[str, Any]:
    st = os.lstat(path)
    kind = "directory" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file"
    target = None
    if kind == "symlink":
        target = os.readlink(path)
        try:
            kind = "directory" if stat.S_ISDIR(os.stat(path).st_mode) else "file"
        except OSError:
            kind = "file"
    return {
        "name": os.path.basename(path.rstrip("/")) or "/", "type": kind, "path": path, "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode), "permissions": stat.filemode(st.st_mode), "owner": str(st.st_uid),
        "group": str(st.st_gid), "modified_time": st.st_mtime, "symlink_target": target,
    }


def _abs(path: str, default_dir: str) -> str:
    if not path:
        raise ValueError("a path is required")
    return os.path.normpath(path if path.startswith("/") else os.path.join(default_dir, path))


def fs_op(req: dict[str, Any]) -> dict[str, Any]:
    home = BASE_ENV.get("HOME", "/")
    op = req["op"]
    try:
        path = _abs(req.get("path", ""), home)
        if op == "read":
            limit = int(req.get("limit", 64 * 1024 * 1024))
            if os.path.isdir(path):
                return _err("invalid_argument", f"path is a directory: {path}")
            with open(path, "rb") as fh:
                data = fh.read(limit + 1)
            if len(data) > limit:
                return _err("resource_exhausted", f"file over {limit} bytes: {path}")
            return {"data": base64.b64encode(data).decode()}
        if op == "write":
            os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
            if os.path.isdir(path):
                return _err("invalid_argument", f"path is a directory: {path}")
            tmp = f"{path}.rsigym-{os.getpid()}.part"
            with open(tmp, "wb") as fh:
                fh.write(base64.b64decode(req.get("data", "")))
            os.replace(tmp, path)
            return {"entry": _entry(path)}
        if op == "stat":
            return {"entry": _entry(path)}
        if op == "listdir":
            depth = max(1, int(req.get("depth", 1)))
            if not os.path.isdir(path):
                return _err("invalid_argument", f"path is not a directory: {path}")
            entries: list[dict[str, Any]] = []
            base_depth = path.rstrip("/").count("/")
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(dirs) + sorted(files):
                    entries.append(_entry(os.path.join(root, name)))
                if root.rstrip("/").count("/") - base_depth + 1 >= depth:
                    dirs[:] = []
            return {"entries": entries}
        if op == "mkdir":
            if os.path.isdir(path):
                return {"created": False, "entry": _entry(path)}
            os.makedirs(path)
            return {"created": True, "entry": _entry(path)}
        if op == "remove":
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            return {"ok": True}
        if op == "rename":
            dest = _abs(req.get("destination", ""), home)
            os.replace(path, dest)
            return {"entry": _entry(dest)}
    except FileNotFoundError as e:
        return _err("not_found", f"no such file or directory: {e.filename or req.get('path')}")
    except PermissionError as e:
        return _err("permission_denied", f"permission denied: {e.filename or req.get('path')}")
    except FileExistsError as e:
        return _err("already_exists", f"already exists: {e.filename or req.get('path')}")
    except (ValueError, OSError) as e:
        return _err("invalid_argument", str(e))
    return _err("unimplemented", f"unknown operation {op!r}")


async def _pump(proc: Proc, stream: asyncio.StreamReader | None, name: str) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(CHUNK)
        if not chunk:
            return
        event = {name: base64.b64encode(chunk).decode()}
        for q in list(proc.subscribers):
            await q.put(event)


async def _watch(proc: Proc) -> None:
    await asyncio.gather(_pump(proc, proc.process.stdout, "stdout"), _pump(proc, proc.process.stderr, "stderr"))
    code = await proc.process.wait()
    status = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name.lower()[3:]}"
    proc.done = True
    for q in list(proc.subscribers):
        await q.put({"end": {"exit_code": code, "status": status}})
    await asyncio.sleep(5)
    PROCS.pop(proc.pid, None)


async def start(req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
    env = dict(BASE_ENV)
    env.update({str(k): str(v) for k, v in (req.get("envs") or {}).items()})
    cwd = req.get("cwd") or env.get("HOME", "/")
    try:
        process = await asyncio.create_subprocess_exec(
            req["cmd"], *[str(a) for a in req.get("args", [])], cwd=cwd, env=env,
            stdin=asyncio.subprocess.PIPE if req.get("stdin") else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )
    except (OSError, ValueError) as e:
        code = ("not_found" if isinstance(e, FileNotFoundError)
                else "resource_exhausted" if isinstance(e, BlockingIOError)  # EAGAIN: at the process cap
                else "invalid_argument")
        await _send(writer, _err(code, str(e)))
        return
    proc = Proc(process.pid, {k: req.get(k) for k in ("cmd", "args", "envs", "cwd", "tag")}, process)
    PROCS[proc.pid] = proc
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(STREAM_EVENTS)
    proc.subscribers.append(queue)
    proc.watcher = asyncio.ensure_future(_watch(proc))
    await _send(writer, {"start": {"pid": proc.pid}})
    await _stream(proc, queue, writer)


async def _stream(proc: Proc, queue: asyncio.Queue[dict[str, Any]], writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            event = await queue.get()
            await _send(writer, event)
            if "end" in event:
                return
    finally:
        if queue in proc.subscribers:
            proc.subscribers.remove(queue)
        while not queue.empty():  # a pump waiting on this gone subscriber goes on
            queue.get_nowait()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        line = await reader.readline()
        req = json.loads(line)
        op = req.get("op")
        if op == "configure":
            await _send(writer, await configure(req))
        elif PENDING["configure"] and op != "ping":
            await _send(writer, _err("failed_precondition", "this sandbox has not been claimed yet"))
        elif op == "start":
            await start(req, writer)
        elif op == "connect":
            proc = PROCS.get(int(req.get("pid", -1)))
            if proc is None or proc.done:
                await _send(writer, _err("not_found", f"process {req.get('pid')} not found"))
            else:
                queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(STREAM_EVENTS)
                proc.subscribers.append(queue)
                await _send(writer, {"start": {"pid": proc.pid}})
                await _stream(proc, queue, writer)
        elif op == "list":
            await _send(writer, {"processes": [dict(p.request, pid=p.pid) for p in PROCS.values() if not p.done]})
        elif op in ("signal", "input", "close_stdin"):
            proc = PROCS.get(int(req.get("pid", -1)))
            if proc is None or proc.done:
                await _send(writer, _err("not_found", f"process {req.get('pid')} not found"))
            elif op == "signal":
                _signal_group(proc.pid, int(req.get("signal", signal.SIGKILL)))
                await _send(writer, {"ok": True})
            elif proc.process.stdin is None:
                await _send(writer, _err("failed_precondition", "the process was started without stdin"))
            elif op == "input":
                proc.process.stdin.write(base64.b64decode(req.get("data", "")))
                await proc.process.stdin.drain()
                await _send(writer, {"ok": True})
            else:
                proc.process.stdin.close()
                await _send(writer, {"ok": True})
        elif op == "ping":
            await _send(writer, {"ok": True, "pid": os.getpid()})
        else:
            await _send(writer, await asyncio.get_running_loop().run_in_executor(None, fs_op, req))
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    except (ValueError, KeyError, TypeError) as e:
        try:
            await _send(writer, _err("invalid_argument", f"bad request: {e}"))
        except ConnectionError:
            pass
    finally:
        try:
            writer.close()
        except ConnectionError:
            pass


async def _send(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(json.dumps(obj).encode() + b"\n")
    await writer.drain()


async def forward(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, target: str) -> None:
    """Relay one TCP connection inside the sandbox to the model door's Unix socket."""
    try:
        up_r, up_w = await asyncio.open_unix_connection(target)
    except OSError:
        client_w.close()
        return

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while chunk := await r.read(CHUNK):
                w.write(chunk)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            try:
                w.close()
            except ConnectionError:
                pass

    await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))


async def open_forwards(specs: list[str]) -> None:
    for spec in specs:
        address, _, target = spec.partition("=")
        host, _, port = address.rpartition(":")
        await asyncio.start_server(functools.partial(forward, target=target), host, int(port))


async def configure(req: dict[str, Any]) -> dict[str, Any]:
    """Once, and only on a warm-pool agent before anything ran in it: the claiming sandbox's
    environment and door. Refused afterwards, so code inside cannot re-point the sandbox."""
    if not PENDING["configure"]:
        return _err("failed_precondition", "this sandbox is already configured")
    env = req.get("env") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("env must map strings to strings")
    PENDING["configure"] = False
    BASE_ENV.update(env)
    try:
        os.chdir(BASE_ENV.get("HOME", "/"))
    except OSError:
        pass
    await open_forwards([str(f) for f in req.get("forward") or []])
    return {"ok": True}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--forward", action="append", default=[], help="HOST:PORT=UNIX_SOCKET")
    parser.add_argument("--await-configure", action="store_true", help="a warm-pool sandbox, claimed later")
    args = parser.parse_args()
    with open(args.env_file) as fh:  # noqa: ASYNC230 - once, before anything is served
        BASE_ENV.update(json.load(fh))
    PENDING["configure"] = args.await_configure
    os.chdir(BASE_ENV.get("HOME", "/"))
    await open_forwards(args.forward)
    server = await asyncio.start_unix_server(handle, args.socket, limit=MAX_LINE)
    os.chmod(args.socket, 0o600)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
