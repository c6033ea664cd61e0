"""The sandbox's /etc/profile, with its ``id -u`` answered by the shell.

E2B's SDK runs every command as ``/bin/bash -l -c …``: a login shell, which reads /etc/profile.
Debian's (and Ubuntu's) asks ``"$(id -u)"`` to choose PATH — a fork and an exec of ``id`` in the
sandbox, ~2 ms of each command on a 2-core box (bubblewrap: ``bash -l -c 'echo ok'`` 8.1 ms, with
this file 5.9, ``bash -c`` 5.4). A host-profile sandbox gets the host's file with that question
written ``"${EUID:-$(id -u)}"``: bash sets ``EUID`` itself (read-only, the number ``id -u``
prints), a shell without it still runs ``id``. Nothing else in the file changes; where the host's
profile does not ask, nothing is bound over it and the sandbox reads the host's file as before.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

HOST_PROFILE = Path("/etc/profile")
ASKED = '"$(id -u)"'
ANSWERED = '"${EUID:-$(id -u)}"'


def write_login_profile(directory: Path, source: Path = HOST_PROFILE) -> Path | None:
    """Write the rewritten profile into ``directory`` (world-readable: sandbox uids bind it) and
    return its path; None when ``source`` is missing, unreadable or has nothing to rewrite."""
    try:
        text = source.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if ASKED not in text:
        return None
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".profile-")
    with os.fdopen(fd, "w") as out:
        out.write(text.replace(ASKED, ANSWERED))
    os.chmod(tmp, 0o644)
    target = directory / "login-profile"
    os.replace(tmp, target)  # whole or not at all: a sandbox never binds a half-written file
    return target
