"""Local sandboxes: bubblewrap namespaces, an unprivileged uid each, resource limits.

A sandbox is one bubblewrap process tree: all namespaces unshared (mount, PID, IPC, UTS,
network, user, cgroup), so it has no route anywhere — not even to the host's 127.0.0.1 —
unless its key's policy grants internet. Its root filesystem is a private tmpfs of the
template's ``disk_mb`` (bubblewrap's ``--size``), its one writable place, with only the
template's system directories bound read-only on it (the host profile: /usr, /bin, /lib, /etc …,
or a rootfs directory), so the gym's data dir, the checkout, /root and other sandboxes simply
are not there, and writing past ``disk_mb`` fails with ENOSPC inside without touching the
host's disk. The host keeps only a small control directory per sandbox under the scratch root
(``[sandbox] local_root``, default ``RSIGYM_SCRATCH_DIR``), which the sandbox may not write to
once its agent is up (when the gym runs as root). The first process is the sandbox agent; every
command is its descendant in the sandbox's PID namespace, so killing bubblewrap kills the
whole namespace: nothing of a sandbox survives it.

Limits: when the gym runs as root each sandbox gets its own uid (uid_base + n), which makes
RLIMIT_NPROC a per-sandbox process cap (a fork bomb stops there) and makes files of other
sandboxes unreadable; RLIMIT_AS / RLIMIT_CPU / RLIMIT_FSIZE bound memory, CPU time and file
size of every process; where cgroup v1/v2 pids and cpu controllers are writable the
sandbox also gets a pids cgroup capping its whole process tree and a CFS quota of the
template's cpu_count CPUs (see services/sandbox/cgroups.py for the fallback without them, and
for why memory is not capped by a cgroup).

Warm pool (``[sandbox] warm_pool``): once a template has been used, the backend keeps that many
of its sandboxes started ahead — namespaces built, limits set, agent listening, nothing run —
and a create claims one instead of starting bubblewrap and the agent's interpreter (~60 ms here)
on the request path. A pool sandbox belongs to nobody and costs nobody until claimed: the service takes the key's slot
and opens its meter exactly as for a cold start. Claiming tells the waiting agent, once, the
sandbox's id, environment and door (the agent refuses everything else until then, and any second
``configure`` after), so a claimed sandbox is one no other owner ever reached; it is never
returned to the pool — killing it ends its namespaces as for any other. Every local sandbox's
hostname is ``sandbox`` (the id is in ``E2B_SANDBOX_ID``), cold or warm alike.

Kernel surface: the sandbox's code may not create user namespaces of its own (bubblewrap's
``--disable-userns``, where the installed bubblewrap has it — 0.8.0 and later — and the
seccomp filter either way), and a seccomp deny-list (services/sandbox/seccomp.py) refuses the
syscalls escapes are built on — keyrings, eBPF, perf, ptrace, mounts, modules … — with EPERM.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from kit.config import SandboxTemplate
from kit.errors import GymError, ServiceUnavailable, Unprocessable
from kit.host_uids import HostUidPool, kill_uid, pids_of_uid
from kit.private_files import open_private, traversable_dir, write_private
from services.sandbox import seccomp
from services.sandbox.backends.base import STREAM_LINE_LIMIT, SandboxSpec
from services.sandbox.backends.local_build import run_build
from services.sandbox.cgroups import SandboxCgroup
from services.sandbox.dockerfile import Steps
from services.sandbox.login_profile import write_login_profile
from services.sandbox.namespace_init import NamespaceInit

log = logging.getLogger("rsigym.sandbox")

AGENT_SOURCE = Path(__file__).with_name("inbox_agent.py")
STREAM_LIMIT = 128 * 1024 * 1024
"""The longest answer line of a one-shot call (a file read of up to 64 MiB, base64)."""
START_TIMEOUT_S = 15.0
HOSTNAME = "sandbox"
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/home/user", "USER": "user",
            "LANG": "C.UTF-8", "E2B_SANDBOX": "true"}
POOL_RETRY_S = 30.0
"""After a pool sandbox failed to start, the pool waits this long before trying that template again."""
INFO_FILE = "bwrap-info.json"
SANDBOX_UMASK = 0o022
LAYER_FILES_INSIDE = "/run/rsigym-layer"
"""Where a built template's own files (its /app, /opt, …) are bound read-only, for the sandbox's
agent to copy into its tmpfs at start (``--seed``)."""
INIT_EXIT_WAIT_S = 5.0
"""How long a kill waits for the namespace's init to exit before it sweeps the uid instead."""


class SandboxGone(GymError):
    status, type = 404, "not_found"


@dataclass
class _Local:
    spec: SandboxSpec
    uid: int | None
    dir: Path
    process: subprocess.Popen[bytes]
    cgroup: SandboxCgroup | None = None
    init: NamespaceInit | None = None
    """Its PID namespace's init, held by a pidfd once it is up (None: the kill sweeps by uid)."""
    killed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def socket(self) -> str:
        return str(self.dir / "ctl" / "agent.sock")


class LocalBackend:
    name = "local"

    def __init__(self, root: str | None, uid_base: int, *, scratch: Path | None = None, warm_pool: int = 0):
        self.bwrap = shutil.which("bwrap")
        self._owns_root = root is None  # a fresh temporary root is removed again at close
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="rsigym-sandboxes-", dir=scratch))
        traversable_dir(self.root)
        os.chmod(self.root, 0o711)  # sandbox uids must traverse it to their own dir; nothing is listable
        self.uid_base = uid_base
        self.uids = HostUidPool(uid_base)
        self.privileged = os.geteuid() == 0
        if self.privileged:
            _require_traversable(self.root)
        self.login_profile = write_login_profile(self.root)
        """The host's /etc/profile without its ``id -u`` process, bound over /etc/profile in host-profile
        sandboxes (services/sandbox/login_profile.py); None: the host's file as it is."""
        self._sandboxes: dict[str, _Local] = {}
        self._lock = threading.Lock()
        self._layer_lock = threading.Lock()
        self.warm_pool = warm_pool
        self._warm: dict[str, list[_Local]] = {}
        """Ready, unclaimed sandboxes by template (its settings as JSON: a changed template is another pool)."""
        self._pool_templates: dict[str, SandboxTemplate] = {}
        self._pool_failed_at: dict[str, float] = {}
        self._pool_wake = threading.Condition(self._lock)
        self._closing = False
        self._filler: threading.Thread | None = None
        self.starts = {"warm": 0, "cold": 0}
        """Creates served from the pool and started on the request path (for metrics and tests)."""

    # -- lifecycle ---------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> str:
        if self.bwrap is None:
            raise Unprocessable("local sandboxes need bubblewrap (bwrap) on the sandbox host", param="template")
        if spec.internet:
            raise Unprocessable(
                "the local sandbox backend gives sandboxes no network; internet needs the e2b backend",
                param="allow_internet_access",
            )
        local = self._claim(spec) if self.warm_pool else None
        how = "warm" if local is not None else "cold"
        if local is None:
            local = self._start_new(spec, spec.sandbox_id, _env_of(spec), pooled=False)
        with self._lock:
            self.starts[how] += 1
            self._sandboxes[spec.sandbox_id] = local
        return spec.sandbox_id

    def _layer(self, template: SandboxTemplate) -> Path | None:
        """A built template's layer where the sandbox's uid can reach it: linked (or copied) once
        into this backend's root, which every sandbox uid traverses (the templates directory, in
        the gym's private data dir, is not)."""
        if not template.layer:
            return None
        target = self.root / "layers" / template.name
        with self._layer_lock:
            if not target.is_dir():
                traversable_dir(self.root / "layers")
                os.chmod(self.root / "layers", 0o711)
                staging = target.with_name(target.name + ".tmp")
                shutil.rmtree(staging, ignore_errors=True)
                try:
                    shutil.copytree(template.layer, staging, symlinks=True, copy_function=_link_or_copy)
                except OSError as err:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise ServiceUnavailable(f"template {template.name!r}: its built layer is unreadable ({err})") from None
                os.chmod(staging, 0o755)
                staging.rename(target)
        return target

    def build_template(self, base: SandboxTemplate, steps: Steps, context: Path, out: Path,
                       egress: list[str] | None = None) -> str:
        """Build a Dockerfile's steps into a template layer (services/sandbox/backends/local_build.py),
        as an unprivileged uid of the pool when the gym runs as root."""
        if self.bwrap is None:
            raise Unprocessable("template builds need bubblewrap (bwrap) on the sandbox host", param="base")
        uid = self.uids.take() if self.privileged else None
        try:
            return run_build(bwrap=self.bwrap, base=base, steps=steps, context=context, out=out, uid=uid,
                             work_root=self.root, egress=egress or ())
        finally:
            if uid is not None:
                kill_uid(uid)
            self.uids.free(uid)

    def make_dirs(self, sandbox_id: str, dirs: list[tuple[str, int | None]]) -> list[str]:
        """By the sandbox's own agent (the agent protocol's ``mkdirs``, as the sandbox's user,
        inside its namespaces): one request where ``mkdir -p`` and ``chmod`` in its first command
        were two program starts (~1.5 ms each on a 2-core box)."""
        local = self._sandboxes.get(sandbox_id)
        if local is None:
            raise ServiceUnavailable(f"sandbox {sandbox_id} is not running")
        try:
            answer = _call_sync(local.socket, {"op": "mkdirs", "dirs": [[path, mode] for path, mode in dirs]})
        except OSError as err:
            raise ServiceUnavailable(f"sandbox {sandbox_id} did not answer: {err}") from None
        if "error" in answer:
            raise Unprocessable(f"could not make the sandbox's directories: {answer['error'].get('message')}",
                                param="rsigymDirs")
        return [str(p) for p in answer.get("made", [])]

    def _start_new(self, spec: SandboxSpec, name: str, env: dict[str, str], *, pooled: bool) -> _Local:
        uid = self.uids.take() if self.privileged else None
        base = self.root / name
        try:
            return self._start(spec, uid, base, env, pooled=pooled)
        except BaseException:
            self.uids.free(uid)
            shutil.rmtree(base, ignore_errors=True)
            raise

    # -- the warm pool -------------------------------------------------------------------

    def _claim(self, spec: SandboxSpec) -> _Local | None:
        """A ready pool sandbox of the spec's template, configured for the spec; None when the pool
        has none (the caller starts one cold). Asks the pool to fill up again either way."""
        key = spec.template.model_dump_json()
        while True:
            with self._lock:
                if self._closing:
                    return None
                self._pool_templates.setdefault(key, spec.template)
                if self._filler is None:
                    self._filler = threading.Thread(target=self._fill, name="rsigym-sandbox-pool", daemon=True)
                    self._filler.start()
                ready = self._warm.setdefault(key, [])
                local = ready.pop(0) if ready else None
                self._pool_wake.notify_all()
            if local is None:
                return None
            forward = [_door_forward(spec.door_port)] if spec.door_port is not None else []
            try:
                if local.process.poll() is not None:
                    raise OSError("the pool sandbox had exited")
                answer = _call_sync(local.socket, {"op": "configure", "env": _env_of(spec), "forward": forward})
                if "error" in answer:
                    raise OSError(answer["error"].get("message", "refused"))
            except OSError as err:  # discard it and take the next (or start cold)
                log.warning("pool sandbox %s unusable (%s); discarded", local.dir.name, err)
                self._destroy(local)
                continue
            local.spec = spec
            return local

    def _fill(self) -> None:
        """The pool's filler thread: starts one sandbox at a time for whichever template is short."""
        while True:
            with self._lock:
                job = None
                while job is None and not self._closing:
                    now = time.monotonic()
                    for key, template in self._pool_templates.items():
                        if (len(self._warm.get(key, [])) < self.warm_pool
                                and now - self._pool_failed_at.get(key, -POOL_RETRY_S) >= POOL_RETRY_S):
                            job = (key, template)
                            break
                    else:
                        self._pool_wake.wait(POOL_RETRY_S)
                if self._closing or job is None:
                    return
            key, template = job
            name = f"warm_{secrets.token_hex(8)}"
            try:
                local = self._start_new(SandboxSpec(name, template), name, dict(BASE_ENV), pooled=True)
            except (GymError, OSError, ValueError) as err:  # the next create starts cold and reports it itself
                log.warning("warm pool for template %s: could not start a sandbox: %s", template.name, err)
                with self._lock:
                    self._pool_failed_at[key] = time.monotonic()
                continue
            try:
                # A fresh agent's first request takes ~1.3 ms more than the next (its accept,
                # read and answer paths run for the first time): that one is the pool's, not the
                # claim's. A ping runs nothing in the sandbox.
                _call_sync(local.socket, {"op": "ping"})
            except OSError as err:
                log.warning("pool sandbox %s did not answer its first ping (%s); discarded", local.dir.name, err)
                self._destroy(local)
                continue
            with self._lock:
                if not self._closing:
                    self._warm.setdefault(key, []).append(local)
                    continue
            self._destroy(local)
            return

    def warm_count(self, template: SandboxTemplate | None = None) -> int:
        """Ready pool sandboxes (of one template, or all)."""
        with self._lock:
            if template is not None:
                return len(self._warm.get(template.model_dump_json(), []))
            return sum(len(v) for v in self._warm.values())

    def _destroy(self, local: _Local) -> None:
        self._terminate(local)
        shutil.rmtree(local.dir, ignore_errors=True)
        self.uids.free(local.uid)

    def _start(self, spec: SandboxSpec, uid: int | None, base: Path, env: dict[str, str], *, pooled: bool) -> _Local:
        if not tmpfs_size_supported(self.bwrap or "bwrap"):
            raise ServiceUnavailable("this bubblewrap cannot size a tmpfs (--size, bubblewrap 0.8.0 and later), so a "
                                     "sandbox's disk_mb could not be enforced; install a newer bubblewrap")
        ctl = base / "ctl"
        for d in (base, ctl):
            d.mkdir(mode=0o700)
        os.chmod(base, 0o711)
        # The sandbox's uid reads these two through read-only binds; nobody else reads them (env.json
        # holds the sandbox's environment, a model door's key among it): that uid's alone, 0400.
        write_private(base / "agent.py", AGENT_SOURCE.read_bytes())
        write_private(base / "env.json", json.dumps(env))
        for f in ("agent.py", "env.json"):
            if uid is not None:
                os.chown(base / f, uid, uid)
            os.chmod(base / f, 0o400)
            # their mount points in ctl, made here (empty, the gym's) rather than by bubblewrap under the umask
            os.close(open_private(ctl / f, os.O_WRONLY | os.O_CREAT))
        if uid is not None:
            os.chown(ctl, uid, uid)  # the agent creates its socket here; taken back once it is ready
        cgroup = SandboxCgroup.create(base.name, spec.template.max_processes, spec.template.cpu_count)
        t = spec.template
        limits = {"as": t.memory_mb * 1024 * 1024, "cpu": t.cpu_seconds, "fsize": t.max_file_mb * 1024 * 1024, "core": 0}
        if uid is not None:
            limits["nproc"] = t.max_processes
        # Limits and the cgroup are set by small programs the first process execs through (sh, then
        # prlimit), not by a preexec_fn: without one, Python spawns with vfork, which does not copy
        # the gym's page tables while holding the GIL (a fork here stalled every request ~70 ms).
        prefix = ["prlimit", *(f"--{name}={value}" for name, value in limits.items()), "--"]
        if cgroup is not None:
            prefix = [*cgroup.entering_argv(), *prefix]
        filter_fd = seccomp.filter_fd()
        info_fd = -1
        layer = self._layer(spec.template)
        try:
            # bubblewrap writes its namespace init's host pid here (host-only: base is the gym's)
            info_fd = os.open(base / INFO_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            argv = [*prefix, *self._argv(spec, uid, base, filter_fd, info_fd, pooled=pooled, layer=layer)]
            with os.fdopen(open_private(base / "agent.log"), "wb") as errors:
                # umask: what the sandbox's own processes create is as in any Linux box (and E2B's),
                # whatever the gym's own (0077: kit/private_files.py)
                process = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                    pass_fds=(filter_fd, info_fd), start_new_session=True, env={"PATH": "/usr/bin:/bin"},
                    umask=SANDBOX_UMASK,
                )
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            os.close(filter_fd)
            if info_fd >= 0:
                os.close(info_fd)
        local = _Local(spec, uid, base, process, cgroup)
        if not self._wait_ready(local):
            self._terminate(local)
            err = (base / "agent.log").read_bytes()[-2000:]
            raise ServiceUnavailable(f"the sandbox failed to start: {err.decode(errors='replace').strip() or 'no output'}")
        # Written before the init started the agent, so complete now that the agent is ready.
        local.init = NamespaceInit.from_info(base / INFO_FILE)
        if uid is not None:
            # The one host directory the sandbox sees writable: the agent's socket is in it, now
            # nothing more is written there by the sandbox (its disk is its tmpfs, nothing else).
            os.chown(ctl, 0, 0)
            os.chmod(ctl, 0o711)
        return local

    def _argv(self, spec: SandboxSpec, uid: int | None, base: Path, filter_fd: int, info_fd: int, *,
              pooled: bool, layer: Path | None = None) -> list[str]:
        t = spec.template
        bwrap = self.bwrap or "bwrap"
        argv: list[str] = []
        if uid is not None:
            argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        # --unshare-all only *tries* a user namespace; --disable-userns needs one for certain
        argv += [bwrap, "--die-with-parent", "--unshare-all", "--unshare-user", *seccomp.disable_userns_flags(bwrap),
                 "--seccomp", str(filter_fd), "--info-fd", str(info_fd), "--hostname", HOSTNAME,
                 "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
                 # the whole writable filesystem: one tmpfs of disk_mb, so writing past it is ENOSPC
                 "--size", str(t.disk_mb * 1024 * 1024), "--tmpfs", "/"]
        if t.kind == "rootfs":
            if not t.rootfs or not Path(t.rootfs).is_dir():
                raise Unprocessable(f"template {t.name!r}: rootfs {t.rootfs!r} is not a directory", param="templateID")
            for name in sorted(os.listdir(t.rootfs)):
                if name not in {"home", "tmp", "run", "var", "proc", "dev", "sys"}:
                    argv += ["--ro-bind", str(Path(t.rootfs) / name), f"/{name}"]
        else:
            for d in t.host_dirs:
                argv += ["--ro-bind-try", d, d]
            if self.login_profile is not None and "/etc" in t.host_dirs:
                argv += ["--ro-bind", str(self.login_profile), "/etc/profile"]
        for sub, mode in (("/home/user", "0755"), ("/tmp", "1777"), ("/run", "0755"), ("/var/tmp", "1777")):
            argv += ["--perms", mode, "--dir", sub]
        # A built template's layer (services/sandbox/backends/local_build.py): /usr/local read-only
        # as the system directories; its own files for the agent to copy in (``--seed``).
        if layer is not None:
            argv += ["--ro-bind", str(layer / "usr-local"), "/usr/local", "--ro-bind", str(layer / "files"),
                     LAYER_FILES_INSIDE]
        argv += ["--proc", "/proc", "--dev", "/dev",
                 "--bind", str(base / "ctl"), "/run/rsigym",
                 "--ro-bind", str(base / "agent.py"), "/run/rsigym/agent.py",
                 "--ro-bind", str(base / "env.json"), "/run/rsigym/env.json",
                 "--chdir", "/home/user", "--",
                 t.python, "-I", "-S", "/run/rsigym/agent.py", "--socket", "/run/rsigym/agent.sock",
                 "--env-file", "/run/rsigym/env.json"]
        if layer is not None:
            argv += ["--seed", LAYER_FILES_INSIDE]
        if pooled:
            argv += ["--await-configure"]
        elif spec.door_port is not None:
            argv += ["--forward", _door_forward(spec.door_port)]
        return argv

    def _wait_ready(self, local: _Local) -> bool:
        assert local.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = b""
        while time.monotonic() < deadline:
            if local.process.poll() is not None:
                return False
            ready = _readline_with_timeout(local.process.stdout, deadline - time.monotonic())
            if ready is None:
                break
            line = ready
            if line.strip() == b"ready":
                return True
        return False

    def door_path(self, sandbox_id: str) -> str | None:
        local = self._sandboxes.get(sandbox_id)
        return str(local.dir / "ctl" / "door.sock") if local else None

    def uid_of(self, sandbox_id: str) -> int | None:
        """The host uid the sandbox runs as (None: the gym's own, when it is not root)."""
        local = self._sandboxes.get(sandbox_id)
        return local.uid if local else None

    def exit_reason(self, sandbox_id: str) -> str:
        """Why a sandbox's first process ended on its own (for the record)."""
        local = self._sandboxes.get(sandbox_id)
        if local is None:
            return "unknown"
        code = local.process.poll()
        try:
            tail = (local.dir / "agent.log").read_bytes()[-500:].decode(errors="replace").strip()
        except OSError:
            tail = ""
        return f"exit status {code}" + (f": {tail}" if tail else "")

    def alive(self, sandbox_id: str) -> bool:
        local = self._sandboxes.get(sandbox_id)
        return local is not None and not local.killed and local.process.poll() is None

    def kill(self, sandbox_id: str) -> None:
        with self._lock:
            local = self._sandboxes.pop(sandbox_id, None)
        if local is not None:
            self._destroy(local)

    def _terminate(self, local: _Local) -> None:
        """Kill the sandbox and return once none of its processes runs: its namespace's init is
        killed and waited for through its pidfd (the kernel empties the namespace before that
        exit is reported, see services/sandbox/namespace_init.py); without that handle, or if the
        wait runs out, every process of the sandbox's uid is swept instead."""
        with local.lock:
            local.killed = True
            init, local.init = local.init, None
            if init is not None:
                init.kill()
            try:
                os.killpg(local.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                local.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("sandbox %s: bubblewrap did not exit after SIGKILL", local.spec.sandbox_id)
            if local.process.stdout is not None:
                local.process.stdout.close()
            emptied = False
            if init is not None:
                emptied = init.wait_gone(INIT_EXIT_WAIT_S)
                init.close()
                if not emptied:
                    log.warning("sandbox %s: its namespace init did not exit within %.0f s of SIGKILL; "
                                "sweeping its uid", local.spec.sandbox_id, INIT_EXIT_WAIT_S)
            if local.uid is not None and not emptied:
                kill_uid(local.uid)
            if local.cgroup is not None:
                local.cgroup.remove()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._pool_wake.notify_all()
            filler, self._filler = self._filler, None
            warm = [local for ready in self._warm.values() for local in ready]
            self._warm.clear()
        if filler is not None:
            filler.join(timeout=START_TIMEOUT_S + 5)
        for local in warm:
            self._destroy(local)
        for sandbox_id in list(self._sandboxes):
            self.kill(sandbox_id)
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def processes_of(self, sandbox_id: str) -> list[int]:
        """Host pids of every process of the sandbox (by its uid) — for tests and audits."""
        local = self._sandboxes.get(sandbox_id)
        return pids_of_uid(local.uid) if local and local.uid is not None else []

    # -- agent protocol ----------------------------------------------------------------

    def _socket(self, sandbox_id: str) -> str:
        local = self._sandboxes.get(sandbox_id)
        if local is None or local.killed:
            raise SandboxGone(f"sandbox {sandbox_id} is not running")
        return local.socket

    async def _open(self, sandbox_id: str, limit: int = STREAM_LIMIT) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(self._socket(sandbox_id), limit=limit)
        except OSError as err:
            raise SandboxGone(f"sandbox {sandbox_id} is not answering ({type(err).__name__})") from err

    async def call(self, sandbox_id: str, request: dict[str, Any]) -> dict[str, Any]:
        reader, writer = await self._open(sandbox_id)
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
        if not line:
            raise SandboxGone(f"sandbox {sandbox_id} closed the connection")
        return _parse(line)

    async def stream(self, sandbox_id: str, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        # A small read-ahead: asyncio reads at most about twice the limit before it stops reading
        # the socket, so a caller that does not consume holds the agent (and the process) back.
        reader, writer = await self._open(sandbox_id, STREAM_LINE_LIMIT)
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            while line := await reader.readline():
                event = _parse(line)
                yield event
                if "end" in event or "error" in event:
                    return
            yield {"end": {"exit_code": -1, "status": "sandbox ended"}}
        finally:
            writer.close()


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the layer's own inode, bound read-only: nothing can change it
    except OSError:
        shutil.copy2(src, dst)


@cache
def tmpfs_size_supported(bwrap: str) -> bool:
    """Whether this bubblewrap sizes a tmpfs (``--size``, 0.8.0 and later): without it a
    sandbox's disk could not be bounded, and no sandbox is started."""
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in usage


def _require_traversable(root: Path) -> None:
    """Sandbox uids start bubblewrap themselves, so they must be able to walk down to their
    own directory: every parent of the root needs the others' execute bit."""
    for parent in [root, *root.resolve().parents]:
        if not os.stat(parent).st_mode & 0o001:
            raise ValueError(f"sandbox root {root}: {parent} is not traversable by other users (needs o+x); "
                             "choose another [sandbox] local_root")


def _env_of(spec: SandboxSpec) -> dict[str, str]:
    return {**BASE_ENV, "E2B_SANDBOX_ID": spec.sandbox_id, **spec.envs}


def _door_forward(port: int) -> str:
    return f"127.0.0.1:{port}=/run/rsigym/door.sock"


def _call_sync(path: str, request: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """One request to a sandbox agent from a synchronous caller (claiming a pool sandbox)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return _parse(data)


def _parse(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {"error": {"code": "internal", "message": "the sandbox agent sent a malformed answer"}}
    return value if isinstance(value, dict) else {"error": {"code": "internal", "message": "malformed answer"}}


def _readline_with_timeout(stream: Any, timeout: float) -> bytes | None:
    """A line from ``stream`` once it is readable, None if it is not within ``timeout`` s. Waits
    with ``poll``, not ``select``: ``select`` refuses a descriptor numbered 1024 or more
    (ValueError), and a gym serving many connections has that many open."""
    import select

    poller = select.poll()
    poller.register(stream, select.POLLIN)
    ready = poller.poll(max(timeout, 0) * 1000)
    return stream.readline() if ready else None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
