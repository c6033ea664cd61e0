"""Files at rest belong to the gym: what it keeps under its data dir — the store and its -wal/-shm,
its secrets, datasets, checkpoints, training logs, benchmarks, harness archives and their trees,
trial outputs, audits — is 0600 (a directory 0700, a file that must stay executable 0700), and the
data dir itself is 0700, so no other local user reads or lists a run's data.

Two layers, because either alone leaks:

* the gym's processes (``rsigym up``, ``rsigym serve``, ``rsigym worker``) run under
  :data:`PRIVATE_UMASK` (:func:`restrict_umask`), which covers what libraries write on the gym's
  behalf (Harbor's trial files, ``save_pretrained``, SQLite's journal files);
* every place the gym makes a file or directory there sets its mode itself, or :func:`lock_down`
  the tree a library wrote, which is what holds in a process that never set the umask (the tests,
  anything that embeds a gym).

Untrusted code runs as other uids and is given only what it must reach: sandbox control dirs live
under the scratch dir, not here, traversable (0711) but not listable, and a sandbox's env file is
its uid's alone (services/sandbox/backends/local.py).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("rsigym.files")

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600
EXEC_MODE = 0o700
TRAVERSE_MODE = 0o711


def restrict_umask() -> int:
    """Make every file this process creates from now on private to its user (returns the old umask)."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: Path | str) -> Path:
    """``path``, made with any missing parents, all 0700. An existing directory is set to 0700 too
    when it is this user's — never a shared one (sticky, like /tmp), which only gets a warning."""
    path = Path(path)
    if not _make_dirs(path, DIR_MODE):
        _restrict_existing(path)
    return path


def traversable_dir(path: Path | str) -> Path:
    """``path``, its missing parts made 0711 whatever the umask: other uids (sandboxes) may walk
    through to what is theirs below, but list nothing. Existing directories are left as they are."""
    path = Path(path)
    _make_dirs(path, TRAVERSE_MODE)
    return path


def _make_dirs(path: Path, mode: int) -> list[Path]:
    """Make ``path`` and its missing parents, each ``mode`` whatever the umask (mkdir's mode goes
    through it, and parents get the default); the directories made."""
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    for made in missing:
        os.chmod(made, mode)
    return missing


def _restrict_existing(path: Path) -> None:
    st = os.stat(path)
    if stat.S_IMODE(st.st_mode) & 0o077 == 0:
        return
    if st.st_mode & stat.S_ISVTX or st.st_uid != os.geteuid():
        log.warning("%s is open to other local users (mode %o) and not this gym's own directory; "
                    "give the gym a directory of its own", path, stat.S_IMODE(st.st_mode))
        return
    os.chmod(path, DIR_MODE)


def open_private(path: Path | str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """``os.open`` of a file that is 0600 whoever made it and whatever the umask (an existing file
    keeps its mode through ``os.open``: it is set again)."""
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path | str, data: str | bytes) -> None:
    """Write ``data`` to ``path`` (created or truncated), mode 0600."""
    with os.fdopen(open_private(path), "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def append_private(path: Path | str, text: str) -> None:
    """Append ``text`` to ``path`` (created if missing), mode 0600."""
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a", encoding="utf-8") as fh:
        fh.write(text)


def lock_down(root: Path | str) -> None:
    """Make a tree a library wrote private: directories 0700, files 0600 (0700 when executable by
    their owner). Symlinks are not followed (their targets are inside the tree or not the gym's)."""
    root = Path(root)
    if root.is_symlink() or not root.exists():
        return
    if not root.is_dir():
        _lock_file(root)
        return
    os.chmod(root, DIR_MODE)
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            full = os.path.join(parent, name)
            if not os.path.islink(full):
                os.chmod(full, DIR_MODE)
        for name in files:
            _lock_file(Path(parent) / name)


def _lock_file(path: Path) -> None:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return
    os.chmod(path, EXEC_MODE if st.st_mode & stat.S_IXUSR else FILE_MODE)
