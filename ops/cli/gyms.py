"""Which data dir a local gym was started with, so the operator CLI can say so.

``rsigym up`` notes its URL, data dir and pid in ``~/.cache/rsigym/gyms/`` while it runs; when the
CLI cannot authenticate to a gym (no admin token where it looked, or the gym refused the one it
found — the usual cause is a shell without the ``RSIGYM_DATA_DIR`` the gym was started with), its
error names the data dir the gym at that URL was started with. Only the path is noted, never a
token, and only for gyms of this machine and user.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from kit.settings import default_models_dir


def gyms_dir() -> Path:
    return default_models_dir().parent / "gyms"


def _note(url: str) -> Path:
    return gyms_dir() / (hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16] + ".json")


def announce(url: str, data_dir: Path) -> Path:
    """Note that the gym at ``url`` runs with ``data_dir`` (this process); returns the note."""
    note = _note(url)
    note.parent.mkdir(parents=True, exist_ok=True)
    tmp = note.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"url": url.rstrip("/"), "data_dir": str(Path(data_dir).resolve()), "pid": os.getpid()}))
    tmp.chmod(0o600)
    tmp.replace(note)
    return note


def retract(note: Path) -> None:
    with contextlib.suppress(OSError):
        if json.loads(note.read_text()).get("pid") == os.getpid():
            note.unlink()


def started_with(url: str) -> Path | None:
    """The data dir the gym at ``url`` was started with, if it runs here and said so."""
    try:
        noted = json.loads(_note(url).read_text())
        os.kill(int(noted["pid"]), 0)  # still running
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Path(noted["data_dir"]) if noted.get("url") == url.rstrip("/") else None


def hint(url: str, looked_in: Path) -> str:
    """A sentence for an authentication failure against ``url``."""
    found = started_with(url)
    if found is not None and found != Path(looked_in).resolve():
        return (f" The gym at {url} was started with data dir {found}: set RSIGYM_DATA_DIR={found} "
                "(or pass --data-dir), or RSIGYM_ADMIN_TOKEN.")
    return (f" The CLI read the admin token from {looked_in}/admin-token; point it at the gym's data dir "
            "(RSIGYM_DATA_DIR or --data-dir) or set RSIGYM_ADMIN_TOKEN.")
