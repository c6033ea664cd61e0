"""Building a task's Dockerfile into a sandbox template, on the local backend, without Docker.

A build is one bubblewrap run, isolated like a sandbox (its own unprivileged uid when the gym
runs as root, no network, the seccomp filter, a CPU-time and memory limit, a wall-clock
timeout): the base template's system directories read-only, ``/`` and ``/usr/local`` two sized
tmpfs (what the image adds), the build context (the task's ``environment/``) read-only at
``/run/rsigym/context``. Inside, the process is uid 0 of its own user namespace — a Dockerfile's
``RUN`` is written for root (``pip install`` into the system's site-packages lands in
``/usr/local``) — which gives it no power over anything outside that namespace.

The Dockerfile's steps become one shell script, in file order: ``ENV`` exports, ``WORKDIR``
makes and enters, ``COPY`` copies from the context (sources are resolved and checked on the host
first: nothing outside ``environment/``), ``RUN`` runs ``/bin/sh -c``. A failing step ends the
build, named with its output's tail. Then the script writes ``/usr/local`` and every top-level
directory it made as a tar stream on its stdout, which the host unpacks with tarfile's ``data``
filter (no absolute paths, links out, devices) into the template's layer:

    <template>/usr-local/    bound read-only at /usr/local in the template's sandboxes
    <template>/files/        copied into each sandbox's own tmpfs at start (its /app, /opt, …)

What cannot be built here: system directories other than ``/usr/local`` are the base template's,
read-only (``apt-get install`` fails, as it names). There is no network, except, when the
operator allows hosts for builds (``[sandbox] build_egress``, e.g. the package index), through the
same allowlist proxy a run's agent gets (kit/egress.py): the build's only route out is a relay
inside (kit/namespace_relay.py) to that proxy on the host, and ``HTTPS_PROXY`` points at it. Without
that, ship the wheel in ``environment/`` and ``pip install`` it from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from kit import namespace_relay
from kit.config import SandboxTemplate
from kit.egress import HEAD_LIMIT, EgressPolicy, EgressProxy
from kit.errors import Unprocessable
from services.sandbox import seccomp
from services.sandbox.dockerfile import Steps

CONTEXT_INSIDE = "/run/rsigym/context"
EGRESS_SOCKET_INSIDE = "/run/rsigym/egress.sock"
RELAY_INSIDE = "/run/rsigym/relay.py"
EGRESS_PORT = 8702
SYSTEM_TOP = frozenset({"usr", "bin", "lib", "lib32", "lib64", "libx32", "sbin", "etc", "proc", "dev", "sys",
                        "run", "tmp", "var", "boot", "mnt", "media"})
"""Top-level directories a built layer never carries (the base template's or the sandbox's own)."""
BUILD_TIMEOUT_S = 600
BUILD_DISK_MB = 4096
"""Each of the build's two tmpfs (``/`` and ``/usr/local``)."""
BUILD_MEMORY_MB = 4096
BUILD_CPU_S = 1800
LOG_TAIL = 4000


class BuildFailed(Unprocessable):
    """The Dockerfile could not be built here; the message names the step and its output."""


def build_script(steps: Steps, context: Path, *, proxied: bool = False) -> str:
    """The shell script that replays ``steps`` inside the build; sources checked against ``context``.
    ``proxied``: the build's one way out is the allowlist proxy at 127.0.0.1:EGRESS_PORT."""
    lines = ["set -e", "umask 022", "export HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
             "mkdir -p /root /home/user", "cd /"]
    if proxied:
        url = f"http://127.0.0.1:{EGRESS_PORT}"
        proxies = " ".join(f"{name}={url}" for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"))
        lines.append(f"export {proxies} NO_PROXY= no_proxy=")
    for n, step in enumerate(steps.steps, 1):
        if step.kind == "env":
            lines += [f"export {k}={shlex.quote(v)}" for k, v in step.env if k.isidentifier()]
        elif step.kind == "workdir":
            lines.append(f"mkdir -p {shlex.quote(step.dest)} && cd {shlex.quote(step.dest)}")
        elif step.kind == "copy":
            lines.append(f"echo '@@step {n}: COPY' >&2")
            lines += _copy_lines(step.sources, step.dest, step.mode, context)
        elif step.kind == "run":
            lines.append(f"echo {shlex.quote(f'@@step {n}: RUN {step.command[:200]}')} >&2")
            lines.append(f"/bin/sh -c {shlex.quote(step.command)} 1>&2 || {{ echo \"@@failed $?\" >&2; exit 3; }}")
    lines.append("cd /")
    lines.append("set --")
    lines.append(f"for d in /*; do case \"${{d#/}}\" in {'|'.join(sorted(SYSTEM_TOP))}) ;; *) set -- \"$@\" \"${{d#/}}\";; esac; done")
    lines.append("exec tar -C / --numeric-owner -cf - usr/local \"$@\"")
    return "\n".join(lines) + "\n"


def _copy_lines(sources: tuple[str, ...], dest: str, mode: int | None, context: Path) -> list[str]:
    root = context.resolve()
    found: list[Path] = []
    for pattern in sources:
        rel = pattern.lstrip("/")
        if any(c in rel for c in "*?["):
            matches = sorted(p.resolve() for p in root.glob(rel))
        else:
            candidate = (root / rel).resolve()
            matches = [candidate] if candidate.exists() else []
        for m in matches:
            if not m.is_relative_to(root):
                raise BuildFailed(f"COPY source {pattern!r} is outside the build context", param="dockerfile")
        if not matches:
            raise BuildFailed(f"COPY source {pattern!r} not found in the build context", param="dockerfile")
        found += matches
    into_dir = dest.endswith("/") or len(found) > 1 or any(p.is_dir() for p in found)
    target = dest.rstrip("/") or "/"
    out = [f"mkdir -p {shlex.quote(target if into_dir else str(PurePosixPath(target).parent))}"]
    for path in found:
        inside = str(PurePosixPath(CONTEXT_INSIDE) / path.relative_to(root))
        if path.is_dir():  # Docker copies a directory's contents, not the directory
            out.append(f"cp -RP --preserve=mode,timestamps {shlex.quote(inside)}/. {shlex.quote(target)}/")
        else:  # into an existing directory (``COPY f .``) or as the named file
            out.append(f"if [ -d {shlex.quote(target)} ]; then cp -RP --preserve=mode,timestamps {shlex.quote(inside)} {shlex.quote(target)}/; "
                       f"else cp -RP --preserve=mode,timestamps {shlex.quote(inside)} {shlex.quote(target)}; fi")
    if mode is not None:
        out.append(f"chmod -R {mode:o} {shlex.quote(target)}")
    return out


def build_argv(*, bwrap: str, base: SandboxTemplate, uid: int | None, filter_fd: int, script: Path,
               context: Path, egress_socket: Path | None = None) -> list[str]:
    argv: list[str] = []
    if uid is not None:
        argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    argv += [bwrap, "--die-with-parent", "--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0",
             *seccomp.disable_userns_flags(bwrap), "--seccomp", str(filter_fd), "--hostname", "build",
             "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
             "--size", str(BUILD_DISK_MB * 1024 * 1024), "--tmpfs", "/"]
    for d in base.host_dirs:
        argv += ["--ro-bind-try", d, d]
    argv += ["--size", str(BUILD_DISK_MB * 1024 * 1024), "--tmpfs", "/usr/local",
             "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/run",
             "--ro-bind", str(context), CONTEXT_INSIDE, "--ro-bind", str(script), "/run/rsigym/build.sh"]
    command = ["/bin/sh", "/run/rsigym/build.sh"]
    if egress_socket is not None:  # the only way out: the relay to the host's allowlist proxy
        argv += ["--ro-bind", str(egress_socket), EGRESS_SOCKET_INSIDE,
                 "--ro-bind", namespace_relay.__file__, RELAY_INSIDE]
        command = [base.python, "-I", "-S", RELAY_INSIDE, "--port", str(EGRESS_PORT), "--socket", EGRESS_SOCKET_INSIDE,
                   "--seconds", str(BUILD_TIMEOUT_S), "--", *command]
    return [*argv, "--chdir", "/", "--", *command]


@contextlib.contextmanager
def egress_proxy(allow: Sequence[str], socket_path: Path, log: Path, uid: int | None) -> Iterator[None]:
    """The operator's build allowlist (``[sandbox] build_egress``) served on ``socket_path`` for the
    build's uid alone, by the same proxy that serves a run's agent (kit/egress.py)."""
    loop = asyncio.new_event_loop()
    proxy = EgressProxy(EgressPolicy(allow), log=log)
    server = loop.run_until_complete(asyncio.start_unix_server(proxy.handle, str(socket_path), limit=HEAD_LIMIT))
    if uid is not None:
        os.chown(socket_path, uid, uid)
    socket_path.chmod(0o600)
    thread = threading.Thread(target=loop.run_forever, name="rsigym-build-egress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def run_build(*, bwrap: str, base: SandboxTemplate, steps: Steps, context: Path, out: Path, uid: int | None,
              work_root: Path, egress: Sequence[str] = ()) -> str:
    """Build ``steps`` on ``base`` into ``out`` (``usr-local/``, ``files/``); returns the build's log.
    ``work_root``: a directory the build's uid can traverse (its script and context are put there).
    Raises BuildFailed with the failing step and its output's tail."""
    if base.kind != "host":
        raise BuildFailed(f"template {base.name!r} is a rootfs template; builds start from a host template",
                          param="base")
    script = build_script(steps, context, proxied=bool(egress))
    work = Path(tempfile.mkdtemp(prefix="build-", dir=work_root))
    try:
        os.chmod(work, 0o711)
        script_path = work / "build.sh"
        script_path.write_text(script, encoding="utf-8")
        script_path.chmod(0o444)
        ctx = work / "context"
        shutil.copytree(context, ctx, symlinks=True)
        for dirpath, _subdirs, filenames in os.walk(ctx):  # the build's uid reads it, nobody writes it
            os.chmod(dirpath, 0o755)
            for f in filenames:
                p = Path(dirpath) / f
                if not p.is_symlink():
                    p.chmod(p.stat().st_mode & 0o755 | 0o444)
        limits = [f"--as={BUILD_MEMORY_MB * 1024 * 1024}", f"--cpu={BUILD_CPU_S}", "--core=0"]
        egress_socket = work / "egress.sock" if egress else None
        with contextlib.ExitStack() as stack:
            if egress_socket is not None:
                stack.enter_context(egress_proxy(egress, egress_socket, work / "egress.log", uid))
            filter_fd = seccomp.filter_fd()
            stack.callback(os.close, filter_fd)
            argv = ["prlimit", *limits, "--", *build_argv(bwrap=bwrap, base=base, uid=uid, filter_fd=filter_fd,
                                                          script=script_path, context=ctx,
                                                          egress_socket=egress_socket)]
            tar_out = stack.enter_context(tempfile.TemporaryFile(dir=work))
            err = stack.enter_context(tempfile.TemporaryFile(dir=work))
            try:
                proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=tar_out, stderr=err,
                                      pass_fds=(filter_fd,), timeout=BUILD_TIMEOUT_S, env={"PATH": "/usr/bin:/bin"},
                                      umask=0o022)
            except subprocess.TimeoutExpired:
                raise BuildFailed(f"the build ran past {BUILD_TIMEOUT_S} s", param="dockerfile") from None
            err.seek(0)
            log = err.read().decode(errors="replace")
            if proc.returncode != 0:
                raise BuildFailed(_failure(log, proc.returncode), param="dockerfile")
            tar_out.seek(0)
            _unpack(tar_out, out)
        return log[-LOG_TAIL:] + _egress_summary(work / "egress.log")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _egress_summary(log: Path) -> str:
    """The build's egress decisions, one line each (kept with the template's manifest)."""
    try:
        lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return ""
    return "".join(f"\n@@egress {'allowed' if d.get('allowed') else 'refused'} {d.get('host')}:{d.get('port')}"
                   for d in lines[-50:])


def _failure(log: str, code: int) -> str:
    marks = [line for line in log.splitlines() if line.startswith("@@step ")]
    step = marks[-1][2:] if marks else "the build"
    tail = "\n".join(line for line in log.splitlines() if not line.startswith("@@"))[-1500:].strip()
    hint = ""
    if any(s in tail for s in ("Network is unreachable", "Temporary failure in name resolution",
                               "Could not resolve", "Failed to establish a new connection")):
        hint = " (builds here have no network: put what the step downloads under environment/ and install it from there)"
    elif "Read-only file system" in tail or "Permission denied" in tail:
        hint = (" (the base template's system directories are read-only; a build may write /usr/local, /opt, /app "
                "and other directories of its own)")
    return f"{step} failed (exit {code}){hint}: {tail or 'no output'}"


def _unpack(stream: io.BufferedIOBase | object, out: Path) -> None:
    staging = out.with_name(out.name + ".unpack")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o755)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            tar.extractall(staging, filter=_owned_by_root)
        (staging / "files").mkdir(mode=0o755)
        if (staging / "usr" / "local").is_dir():
            (staging / "usr" / "local").rename(staging / "usr-local")
        else:
            (staging / "usr-local").mkdir(mode=0o755)
        shutil.rmtree(staging / "usr", ignore_errors=True)
        for entry in list(staging.iterdir()):
            if entry.name not in ("files", "usr-local"):
                entry.rename(staging / "files" / entry.name)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _owned_by_root(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's ``data`` filter (no absolute or escaping paths, no devices, no setuid), and every
    file the gym's: a build's uid goes back to the pool and must own nothing it leaves."""
    filtered = tarfile.data_filter(member, dest)
    if filtered is None:
        return None
    mode = filtered.mode
    if mode is not None:  # every sandbox uid reads the layer (a trial copies its files in)
        mode |= 0o444 | (0o111 if filtered.isdir() or mode & 0o100 else 0)
    return filtered.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", mode=mode, deep=False)
