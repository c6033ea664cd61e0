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

Threads, not asyncio: every sandbox starts one of these, and the interpreter's start is most
of a sandbox's cold start (and of the warm pool's work while trials run). Importing asyncio
(with ssl, logging, concurrent.futures, inspect …) took ~45 ms of the ~80 ms to "ready" on a
2-core box; the modules this needs take ~25. One thread serves each connection and one watches
each process (its output, then its exit) — as many as asyncio's child watcher kept on the
interpreters the templates run — each with a small stack, since every process of the
sandbox counts against its address-space limit.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing's import is ~2 ms of every sandbox's start; annotations only
    from typing import Any

CHUNK = 32 * 1024
MAX_LINE = 96 * 1024 * 1024
STREAM_EVENTS = 64
"""Output events held per subscriber (services/sandbox/backends/base.py has the same number): a
subscriber that does not read makes the watcher wait, so the process blocks writing its pipe."""
THREAD_STACK = 1024 * 1024
"""Each thread's stack (the default is RLIMIT_STACK, 8 MiB, of the sandbox's RLIMIT_AS)."""
PUT_POLL_S = 0.5
"""How often a watcher held by a full subscriber queue checks whether that subscriber left."""


class Proc:
    def __init__(self, pid: int, request: dict[str, Any], process: subprocess.Popen[bytes]):
        self.pid, self.request, self.process = pid, request, process
        self.subscribers: list[queue.Queue[dict[str, Any]]] = []
        self.done = False
        self.lock = threading.Lock()
        """Guards ``subscribers`` and ``done``: a subscriber joins a running process, or none."""
        self.stdin_lock = threading.Lock()


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


def make_dirs(req: dict[str, Any]) -> dict[str, Any]:
    """The directories a sandbox starts with (its create's ``rsigymDirs``), in order: each made
    with its parents, then given its mode when one is named — what ``mkdir -p`` then ``chmod``
    do, without starting either program. Answers every directory it made, parents included,
    parents first (each absent before: it holds only what else is listed), or the first
    failure; the directories before it stay made, as a shell's would."""
    made: list[str] = []
    for item in req.get("dirs") or []:
        path, mode = item
        if (not isinstance(path, str) or not path.startswith("/") or path.startswith("//")
                or os.path.normpath(path) != path or "\0" in path):
            return _err("invalid_argument", f"not a normal absolute path: {path!r}")
        if mode is not None and (not isinstance(mode, int) or not 0 <= mode <= 0o777):
            return _err("invalid_argument", f"not a mode: {mode!r}")
        absent: list[str] = []
        try:
            up = path
            while up != "/" and not os.path.lexists(up):
                absent.append(up)
                up = os.path.dirname(up)
            os.makedirs(path, exist_ok=True)
            if mode is not None:
                os.chmod(path, mode)
        except FileExistsError:
            return _err("already_exists", f"not a directory: {path}")
        except PermissionError:
            return _err("permission_denied", f"permission denied: {path}")
        except OSError as e:
            return _err("invalid_argument", f"{path}: {e.strerror or e}")
        made.extend(reversed(absent))
    return {"made": made}


def fs_op(req: dict[str, Any]) -> dict[str, Any]:  # noqa: C901 - the in-sandbox agent's file-op dispatcher (stdlib only, one table)
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


def _publish(proc: Proc, event: dict[str, Any]) -> None:
    """Hand ``event`` to every subscriber, waiting for room in each (back-pressure: a reader that
    does not read holds the process's output back) — except one that has left meanwhile."""
    with proc.lock:
        subscribers = list(proc.subscribers)
    for q in subscribers:
        while True:
            try:
                q.put(event, timeout=PUT_POLL_S)
                break
            except queue.Full:
                with proc.lock:
                    if q not in proc.subscribers:
                        break


def _watch(proc: Proc) -> None:
    """The process's thread: its output, as it comes, until both pipes close; then its exit."""
    pipes = {proc.process.stdout.fileno(): "stdout", proc.process.stderr.fileno(): "stderr"}  # type: ignore[union-attr]
    try:
        with selectors.DefaultSelector() as sel:
            for fd, name in pipes.items():
                sel.register(fd, selectors.EVENT_READ, name)
            while pipes:
                for key, _ in sel.select():
                    chunk = os.read(key.fd, CHUNK)
                    if chunk:
                        _publish(proc, {key.data: base64.b64encode(chunk).decode()})
                    else:
                        sel.unregister(key.fd)
                        del pipes[key.fd]
    except OSError:  # its output cannot be read (nothing known causes it): its exit still is
        pass
    finally:
        proc.process.stdout.close()  # type: ignore[union-attr]
        proc.process.stderr.close()  # type: ignore[union-attr]
    code = proc.process.wait()
    status = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name.lower()[3:]}"
    with proc.lock:
        proc.done = True  # from here no one subscribes: ``connect`` answers not_found
    _publish(proc, {"end": {"exit_code": code, "status": status}})
    if PROCS.get(proc.pid) is proc:  # its pid may already be a new process's
        del PROCS[proc.pid]


def _thread(target: Any, *args: Any) -> None:
    """Run ``target`` on a thread of its own; RuntimeError when none can start (the sandbox is at
    its process cap: threads count)."""
    threading.Thread(target=target, args=args, daemon=True).start()


def start(req: dict[str, Any], conn: socket.socket) -> None:
    env = dict(BASE_ENV)
    env.update({str(k): str(v) for k, v in (req.get("envs") or {}).items()})
    cwd = req.get("cwd") or env.get("HOME", "/")
    try:
        process = subprocess.Popen(
            [req["cmd"], *[str(a) for a in req.get("args", [])]], cwd=cwd, env=env, bufsize=0,
            stdin=subprocess.PIPE if req.get("stdin") else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
    except (OSError, ValueError) as e:
        code = ("not_found" if isinstance(e, FileNotFoundError)
                else "resource_exhausted" if isinstance(e, BlockingIOError)  # EAGAIN: at the process cap
                else "invalid_argument")
        _send(conn, _err(code, str(e)))
        return
    proc = Proc(process.pid, {k: req.get(k) for k in ("cmd", "args", "envs", "cwd", "tag")}, process)
    q: queue.Queue[dict[str, Any]] = queue.Queue(STREAM_EVENTS)
    proc.subscribers.append(q)  # before its output can come
    PROCS[proc.pid] = proc  # before its watcher, which takes it out again when it ends
    try:
        _thread(_watch, proc)
    except RuntimeError:  # no thread to watch it: it does not run unwatched
        del PROCS[proc.pid]
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        _send(conn, _err("resource_exhausted", "the sandbox is at its process cap"))
        return
    _send(conn, {"start": {"pid": proc.pid}})
    _stream(proc, q, conn)


def _stream(proc: Proc, q: queue.Queue[dict[str, Any]], conn: socket.socket) -> None:
    try:
        while True:
            event = q.get()
            _send(conn, event)
            if "end" in event:
                return
    finally:
        with proc.lock:
            if q in proc.subscribers:
                proc.subscribers.remove(q)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _running(pid: Any) -> Proc | None:
    proc = PROCS.get(int(pid))
    return None if proc is None or proc.done else proc


def _read_request(conn: socket.socket) -> dict[str, Any]:
    with conn.makefile("rb") as f:
        line = f.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise ValueError(f"request line over {MAX_LINE} bytes")
    req = json.loads(line)
    if not isinstance(req, dict):
        raise ValueError("a request is a JSON object")
    return req


def handle(conn: socket.socket) -> None:  # noqa: C901 - the in-sandbox agent's request dispatcher
    try:
        req = _read_request(conn)
        op = req.get("op")
        if op == "configure":
            _send(conn, configure(req))
        elif PENDING["configure"] and op != "ping":
            _send(conn, _err("failed_precondition", "this sandbox has not been claimed yet"))
        elif op == "start":
            start(req, conn)
        elif op == "connect":
            proc = PROCS.get(int(req.get("pid", -1)))
            q: queue.Queue[dict[str, Any]] = queue.Queue(STREAM_EVENTS)
            if proc is not None:
                with proc.lock:
                    if proc.done:
                        proc = None
                    else:
                        proc.subscribers.append(q)
            if proc is None:
                _send(conn, _err("not_found", f"process {req.get('pid')} not found"))
            else:
                try:
                    _send(conn, {"start": {"pid": proc.pid}})
                except BaseException:
                    with proc.lock:
                        proc.subscribers.remove(q)
                    raise
                _stream(proc, q, conn)
        elif op == "list":
            _send(conn, {"processes": [dict(p.request, pid=p.pid) for p in list(PROCS.values()) if not p.done]})
        elif op in ("signal", "input", "close_stdin"):
            proc = _running(req.get("pid", -1))
            if proc is None:
                _send(conn, _err("not_found", f"process {req.get('pid')} not found"))
            elif op == "signal":
                _signal_group(proc.pid, int(req.get("signal", signal.SIGKILL)))
                _send(conn, {"ok": True})
            elif proc.process.stdin is None:
                _send(conn, _err("failed_precondition", "the process was started without stdin"))
            else:
                _send(conn, _stdin(proc, op, base64.b64decode(req.get("data", "")) if op == "input" else b""))
        elif op == "ping":
            _send(conn, {"ok": True, "pid": os.getpid()})
        elif op == "mkdirs":
            _send(conn, make_dirs(req))
        else:
            _send(conn, fs_op(req))
    except ConnectionError:
        pass
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        try:
            _send(conn, _err("invalid_argument", f"bad request: {e}"))
        except OSError:
            pass
    except OSError:
        pass
    finally:
        conn.close()


def _stdin(proc: Proc, op: str, data: bytes) -> dict[str, Any]:
    stdin = proc.process.stdin
    assert stdin is not None
    with proc.stdin_lock:
        if stdin.closed:
            return _err("failed_precondition", "the process's stdin is closed")
        if op == "close_stdin":
            stdin.close()
            return {"ok": True}
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(stdin.fileno(), view):]
        except BrokenPipeError:
            return _err("failed_precondition", "the process no longer reads its stdin")
    return {"ok": True}


def _send(conn: socket.socket, obj: dict[str, Any]) -> None:
    conn.sendall(json.dumps(obj).encode() + b"\n")


def _relay(client: socket.socket, target: str) -> None:
    """Relay one TCP connection inside the sandbox to the model door's Unix socket."""
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(target)
        _thread(_pipe, up, client)
    except (OSError, RuntimeError):
        up.close()
        client.close()
        return
    _pipe(client, up)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """One direction of a relay. Its end (EOF or an error) ends the connection both ways."""
    try:
        while chunk := src.recv(CHUNK):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _accept(listener: socket.socket, serve: Any, *extra: Any) -> None:
    """Accept connections forever, each served on a thread of its own. Nothing ends this loop: a
    full file table or process cap costs the connection that met it, not the agent."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            time.sleep(0.05)
            continue
        try:
            _thread(serve, conn, *extra)
        except RuntimeError:
            conn.close()


def open_forwards(specs: list[str]) -> None:
    for spec in specs:
        address, _, target = spec.partition("=")
        host, _, port = address.rpartition(":")
        listener = socket.create_server((host, int(port)), backlog=100)
        _thread(_accept, listener, _relay, target)


def configure(req: dict[str, Any]) -> dict[str, Any]:
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
    try:
        open_forwards([str(f) for f in req.get("forward") or []])
    except (OSError, RuntimeError) as e:
        return _err("unavailable", f"could not open the door: {e}")
    return {"ok": True}


def _options(argv: list[str]) -> dict[str, Any]:
    """``--socket PATH --env-file PATH [--forward HOST:PORT=UNIX_SOCKET]... [--await-configure] [--seed DIR]``
    (by hand: argparse's import is ~5 ms of every sandbox's start)."""
    opts: dict[str, Any] = {"socket": None, "env-file": None, "forward": [], "await-configure": False, "seed": None}
    args = iter(argv)
    for arg in args:
        name = arg[2:] if arg.startswith("--") else ""
        if name == "await-configure":
            opts[name] = True
        elif name in ("socket", "env-file", "forward", "seed"):
            value = next(args, None)
            if value is None:
                sys.exit(f"agent: {arg} needs a value")
            if name == "forward":
                opts[name].append(value)
            else:
                opts[name] = value
        else:
            sys.exit(f"agent: unknown argument {arg!r}")
    if opts["socket"] is None or opts["env-file"] is None:
        sys.exit("agent: --socket and --env-file are required")
    return opts


def seed_root(layer: str) -> None:
    """A built template's own files (its /app, /opt, …), bound read-only at ``layer``, copied into
    this sandbox's writable root before it is ready: its to change, within its disk."""
    for name in sorted(os.listdir(layer)):
        src, dest = os.path.join(layer, name), "/" + name
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest, follow_symlinks=False)


def main() -> None:
    opts = _options(sys.argv[1:])
    if opts["seed"]:
        seed_root(opts["seed"])
    threading.stack_size(THREAD_STACK)
    with open(opts["env-file"]) as fh:
        BASE_ENV.update(json.load(fh))
    PENDING["configure"] = opts["await-configure"]
    os.chdir(BASE_ENV.get("HOME", "/"))
    open_forwards(opts["forward"])
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(opts["socket"])
    os.chmod(opts["socket"], 0o600)
    server.listen(128)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    _accept(server, handle)


if __name__ == "__main__":
    main()
