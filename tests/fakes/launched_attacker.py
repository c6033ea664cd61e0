"""A hostile research agent for the launcher's isolation tests (stdlib only: it runs under the
system python inside the launcher's namespaces). It tries what an agent that wants the host
would try and prints what it got, one ``name: JSON`` line each:

* who it is: uid, gid, capabilities, no_new_privs, seccomp mode, a passwd entry for itself;
* the host's secrets: /etc/shadow, whatever else /etc holds;
* writing the files other processes run: the relay module the supervisor imports, the agents'
  code other runs execute, the harnesses, an operator-installed CLI (``--target``), /etc, /usr;
* making a read-only bind writable again (``mount`` with MS_REMOUNT), mounting a tmpfs;
* a user namespace of its own (where every capability comes back), setuid(0), ptrace.

Then it prints ``done`` and sleeps (``--sleep``) so the host side can look at its processes.
"""

import argparse
import ctypes
import ctypes.util
import errno
import json
import os
import pwd
import time

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
PTRACE_ATTACH = 16


def report(name: str, value: object) -> None:
    print(f"{name}: {json.dumps(value)}", flush=True)


def outcome(ret: int) -> str:
    if ret == 0:
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def status_fields() -> dict[str, str]:
    fields = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
                fields[name] = value.strip()
    return fields


def try_write(path: str) -> str:
    try:
        with open(path, "a") as fh:
            fh.write("\n# written by the launched agent\n")
        return "written"
    except OSError as err:
        return errno.errorcode.get(err.errno or 0, str(err.errno))


def try_read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.read(64)
        return "read"
    except OSError as err:
        return errno.errorcode.get(err.errno or 0, str(err.errno))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", action="append", default=[], help="a file another process runs")
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    uid = os.getuid()
    report("identity", {"uid": uid, "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
                        **status_fields()})
    try:
        entry = pwd.getpwuid(uid)
        report("passwd", {"name": entry.pw_name, "home": entry.pw_dir})
    except KeyError:
        report("passwd", None)
    report("etc", sorted(os.listdir("/etc")))
    report("shadow", try_read("/etc/shadow"))
    report("home_writable", try_write(os.path.join(os.environ["HOME"], "notes.txt")))
    targets = ["/run/rsigym/relay.py", "/agent/scripted.py", "/opt/rsigym/harness/minimal/minimal_agent.py",
               "/etc/passwd", "/usr/bin/python3", *args.target]
    report("writes", {path: try_write(path) for path in targets})
    report("new_file", {d: try_write(os.path.join(d, "planted.py")) for d in ("/run/rsigym", "/agent", "/usr/bin",
                                                                              "/etc")})
    remounts = {}
    for path in ("/run/rsigym/relay.py", "/agent", "/usr", "/etc"):
        remounts[path] = outcome(libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND, None))
    remounts["tmpfs"] = outcome(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
    report("remount", remounts)
    report("after_remount", {path: try_write(path) for path in targets})
    report("unshare_user", outcome(libc.unshare(CLONE_NEWUSER)))
    report("unshare_mount", outcome(libc.unshare(CLONE_NEWNS)))
    report("setuid0", outcome(libc.setuid(0)))
    report("ptrace_parent", outcome(libc.ptrace(PTRACE_ATTACH, os.getppid(), None, None)))
    report("done", True)
    if args.sleep:
        time.sleep(args.sleep)


if __name__ == "__main__":
    main()
