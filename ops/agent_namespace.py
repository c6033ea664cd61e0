"""What a launched research agent runs in (embedded mode): its bubblewrap command line, its
minimal /etc and the privilege drop — contained as a local sandbox is, or more.

* **Its own uid.** When the gym runs as root, bubblewrap runs privileged *without* a user
  namespace (one would map the agent to root, with every capability over its own mounts), builds
  the namespaces and binds, and ``setpriv`` drops the relay and the agent to a uid of the
  host-wide pool the sandboxes use (kit/host_uids.py): no capability, an empty
  bounding set, no supplementary groups, no_new_privs. Files of the host are then the host's:
  root's are not the agent's to write, read-only binds cannot be remounted (no CAP_SYS_ADMIN,
  and seccomp refuses the mount family), setuid binaries run unprivileged. When the gym is not
  root, bubblewrap runs unprivileged in a user namespace and the agent is the gym's own uid.
* **The sandboxes' kernel surface.** The seccomp deny-list of services/sandbox/seccomp.py (no
  mounts, no new user namespaces, no ptrace, keyrings, eBPF …), every namespace unshared
  (network included: the relay's loopback is the agent's only network), a process cap
  (RLIMIT_NPROC on its uid) and a bounded /tmp.
* **A minimal /etc.** No shadow, no gym config, no operator's pip.conf or environment: only the
  host files an ordinary program reads (CA certificates, the loader's cache, time zone, MIME
  types …, :data:`ETC_FROM_HOST`) and a passwd / group / hosts / nsswitch.conf written for the
  run, with an ``agent`` entry for its uid (Claude Code and Node look their user up).
* **Nothing it can change that another process runs.** The relay module (the supervisor imports
  the same file), the agents' code, the harnesses and operator-installed CLIs are bound read-only
  and owned by root; the agent's one writable host directory is its HOME in the run directory.
* **No secret on a command line.** The run key reaches the agent through bubblewrap's own
  environment (``/proc/*/environ`` is its owner's alone), never through argv, which every local
  user reads in ``/proc/*/cmdline``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from kit.host_uids import bwrap_drop
from services.sandbox import seccomp

AGENT_USER = "agent"
HOSTNAME = "agent"
HOME_INSIDE = "/home/agent"
RUN_INSIDE = "/run/rsigym"
INSTRUCTION_INSIDE = f"{RUN_INSIDE}/instruction.md"
SOCK_DIR_INSIDE = f"{RUN_INSIDE}/sock"
SOCKET_INSIDE = f"{SOCK_DIR_INSIDE}/gateway.sock"
EGRESS_SOCKET_INSIDE = f"{SOCK_DIR_INSIDE}/egress.sock"
RELAY_INSIDE = f"{RUN_INSIDE}/relay.py"
AGENTS_INSIDE = "/agent"
HARNESS_INSIDE = "/opt/rsigym/harness"
"""The harnesses' source (``minimal``: the starting point of an agent's own), read-only; the agent image
has it at the same path."""
PYTHON_INSIDE = "/usr/bin/python3"
"""The system interpreter (visible through the host dirs) that runs the relay inside."""
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin")
"""Host directories bound read-only as they are (a usr-merged system's links included)."""
ETC_FROM_HOST = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "ssl/certs", "ssl/openssl.cnf", "pki/tls/certs",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "os-release", "debian_version",
    "lsb-release", "mime.types", "protocols", "services", "host.conf", "gai.conf", "locale.alias", "inputrc",
    "bash.bashrc", "terminfo", "magic", "magic.mime", "perl", "python3",
)
"""What of the host's /etc the agent sees (read-only, each where it exists): what ordinary programs
read, and nothing that holds a secret or the operator's settings. ``python3.*`` is added (Debian's
sitecustomize)."""
ETC_WRITTEN = ("passwd", "group", "hosts", "nsswitch.conf", "hostname")
"""Written for the run (:func:`write_etc`)."""
NPROC = 4096
"""RLIMIT_NPROC for the agent's uid (processes and threads together): a fork bomb stops there."""
TMP_MB = 2048
"""The agent's /tmp (memory-backed) is this large; its HOME is on disk."""


def write_etc(dest: Path, uid: int, gid: int) -> None:
    """The run's own passwd, group, hosts, nsswitch.conf and hostname, in ``dest`` (root's, 0755/0644)."""
    dest.mkdir(exist_ok=True)
    dest.chmod(0o755)  # whatever the supervisor's umask
    files = {
        "passwd": (f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                   f"{AGENT_USER}:x:{uid}:{gid}:research agent:{HOME_INSIDE}:/bin/bash\n"
                   "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
        "group": f"root:x:0:\n{AGENT_USER}:x:{gid}:\nnogroup:x:65534:\n",
        "hosts": f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
                         "protocols: files\nservices: files\n",
        "hostname": f"{HOSTNAME}\n",
    }
    for name, text in files.items():
        path = dest / name
        path.write_text(text)
        path.chmod(0o644)


def _etc_from_host() -> list[str]:
    names = list(ETC_FROM_HOST)
    names += sorted(p.name for p in Path("/etc").glob("python3.*"))
    return [f"/etc/{name}" for name in names if os.path.lexists(f"/etc/{name}")]


def _parents(dest: str, made: set[str], covered: Iterable[str]) -> list[str]:
    """``--dir`` ops (0755) for ``dest``'s parents that nothing bound already covers: a privileged
    bubblewrap would make them 0700, closed to the agent's uid."""
    ops: list[str] = []
    for parent in reversed(Path(dest).parents[:-1]):
        p = str(parent)
        if p in made or any(p == c or p.startswith(c + "/") for c in covered):
            continue
        made.add(p)
        ops += ["--perms", "0755", "--dir", p]
    return ops


def bwrap_argv(*, bwrap: str, uid: int | None, filter_fd: int, run_dir: Path, sock_dir: Path, relay: Path,
               agents: Path, harnesses: Path, binds: list[str], command: list[str],
               port: int, egress_port: int | None) -> list[str]:
    """The whole command line: bubblewrap, the relay inside, then the agent's ``command``. Nothing
    secret is on it; the agent's environment is bubblewrap's (the caller's ``env=``)."""
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", HOSTNAME]
    prefix: list[str] = []
    if uid is not None:
        flags, prefix = bwrap_drop(uid)
        argv += flags
    else:
        argv += ["--unshare-user", *seccomp.disable_userns_flags(bwrap)]
    system = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    for d in system:
        argv += ["--symlink", os.readlink(d), d] if os.path.islink(d) else ["--ro-bind", d, d]
    made: set[str] = set()
    argv += ["--perms", "0755", "--dir", "/etc"]
    made.add("/etc")
    for path in _etc_from_host():
        argv += [*_parents(path, made, system), "--ro-bind", path, path]
    for name in ETC_WRITTEN:
        argv += ["--ro-bind", str(run_dir / "etc" / name), f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(TMP_MB * 1024 * 1024),
             "--tmpfs", "/tmp", "--perms", "0755", "--dir", "/var", "--perms", "1777", "--dir", "/var/tmp"]
    fixed = [("--bind", run_dir / "home", HOME_INSIDE), ("--ro-bind", run_dir / "instruction.md", INSTRUCTION_INSIDE),
             ("--ro-bind", sock_dir, SOCK_DIR_INSIDE), ("--ro-bind", relay, RELAY_INSIDE),
             ("--ro-bind", agents, AGENTS_INSIDE), ("--ro-bind", harnesses, HARNESS_INSIDE)]
    for op, source, dest in fixed:
        argv += [*_parents(dest, made, system), op, str(source), dest]
    for path in binds:  # operator-installed CLIs, at the same place
        argv += [*_parents(path, made, system), "--ro-bind", path, path]
    relay_args = ["--port", str(port), "--socket", SOCKET_INSIDE]
    if egress_port is not None:
        relay_args += ["--egress-port", str(egress_port), "--egress-socket", EGRESS_SOCKET_INSIDE]
    return [*argv, "--seccomp", str(filter_fd), "--chdir", HOME_INSIDE, "--",
            "prlimit", f"--nproc={NPROC}", "--core=0", "--", *prefix,
            PYTHON_INSIDE, "-I", "-S", RELAY_INSIDE, *relay_args, "--", *command]


def prepare_host_side(run_dir: Path, sock_dir: Path, uid: int | None) -> tuple[int, int]:
    """The run's /etc files, and its HOME and socket directory made reachable by the agent's uid
    (``uid`` None: the gym's own). The run directory itself stays the gym's (0700)."""
    agent_uid = uid if uid is not None else os.getuid()
    agent_gid = uid if uid is not None else os.getgid()
    write_etc(run_dir / "etc", agent_uid, agent_gid)
    home = run_dir / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    if uid is not None:
        os.chown(run_dir / "instruction.md", uid, uid)
        (run_dir / "instruction.md").chmod(0o400)  # the agent's to read, alone
        os.chown(home, uid, uid)
        home.chmod(0o711)  # capless bubblewrap (root without DAC override) chdirs into it; the run dir is 0700
        os.chmod(sock_dir, 0o711)  # the agent's uid walks through to its sockets, lists nothing
    return agent_uid, agent_gid


def own_sockets(sock_dir: Path, uid: int | None) -> None:
    """The supervisor's sockets: the agent's uid may connect (0600, its own), nobody else."""
    for name in ("gateway.sock", "egress.sock"):
        path = sock_dir / name
        if path.exists():
            if uid is not None:
                os.chown(path, uid, uid)
            path.chmod(0o600)


def give_back(run_dir: Path, uid: int | None) -> None:
    """After the run: the agent's HOME and instruction become the gym's again, so its uid, handed
    to the next sandbox or run, owns nothing of this one."""
    if uid is None:
        return
    home = run_dir / "home"
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            try:
                os.lchown(os.path.join(root, name), 0, 0)
            except OSError:
                continue
    for path in (home, run_dir / "instruction.md"):
        if path.exists():
            os.chown(path, 0, 0)


def bwrap_path() -> str | None:
    return shutil.which("bwrap")
