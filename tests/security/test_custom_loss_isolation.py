"""A custom loss is the agent's code running on the training host: it must see only the
interpreter, its libraries and its own scratch dir, run as an unprivileged uid, and nothing
it manages to print may travel back to the agent unredacted and untruncated."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import rsigym
from tests.conftest import bearer, create_key
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
ROWS = [{"messages": [{"role": "user", "content": "Repeat: red lion"},
                      {"role": "assistant", "content": "red lion"}]}] * 16

# The attacker: read every canary it is given, list /root, read /etc/shadow, and report it all
# (compactly, first) through the only channel it has: its exception's message.
ATTACK = '''
import errno, os
TARGETS = %r

def _try(path):
    try:
        if os.path.isdir(path):
            return "LS:" + ",".join(sorted(os.listdir(path)))
        with open(path, errors="replace") as fh:
            return "READ:" + fh.read(200).replace(chr(10), " ")
    except OSError as err:
        return "ERR:" + errno.errorcode.get(err.errno or 0, type(err).__name__)

def loss(logits, labels, mask):
    report = " ".join(f"{name}={_try(path)}" for name, path in TARGETS.items())
    raise RuntimeError(f"uid={os.getuid()} gid={os.getgid()} {report}")
'''

@pytest.fixture
def live(gym: Any) -> Iterator[tuple[str, httpx.Client, Any]]:
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=120) as http:
        yield url, http, gym


@pytest.fixture
def canaries() -> Iterator[dict[str, tuple[Path, str]]]:
    """Canary files outside the data dir: in a fresh dir under /tmp, under /var/tmp and in the
    gym user's home (/root here and in CI) — name → (path, secret text)."""
    planted: dict[str, tuple[Path, str]] = {}
    dirs = [Path(tempfile.mkdtemp(prefix="rsigym-canary-")),
            Path(tempfile.mkdtemp(prefix="rsigym-canary-", dir="/var/tmp"))]
    for name, d in zip(("tmp", "vartmp"), dirs, strict=True):
        text = f"canary-{name}-{os.urandom(8).hex()}"
        (d / ".env").write_text(f"OPENAI_API_KEY={text}\n")
        os.chmod(d, 0o755)
        os.chmod(d / ".env", 0o644)  # readable by anyone who can reach it: only the sandbox may stop the loss
        planted[name] = (d / ".env", text)
    home = Path.home() / f".rsigym-canary-{os.urandom(4).hex()}"
    text = f"canary-home-{os.urandom(8).hex()}"
    home.write_text(text)
    planted["home"] = (home, text)
    try:
        yield planted
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        home.unlink(missing_ok=True)


def _fields(error: str) -> dict[str, str]:
    body = error.split("RuntimeError: ", 1)[1]
    return dict(part.split("=", 1) for part in body.split(" ") if "=" in part)


def test_a_custom_loss_reads_nothing_of_the_host_and_runs_unprivileged(live: Any, canaries: Any) -> None:
    url, http, gym = live
    key = create_key(http, 1.0)
    agent = rsigym.Gym(base_url=url, api_key=key["key"])
    targets = {name: str(path) for name, (path, _) in canaries.items()}
    targets |= {"tmpdir": str(canaries["tmp"][0].parent), "roothome": str(Path.home()), "shadow": "/etc/shadow",
                "datadir": str(gym.gateway.context.settings.data_dir)}
    scratch_before = set(glob.glob("/tmp/rsigym-loss-*"))
    ds = agent.training.upload_dataset(ROWS)
    job = agent.training.wait(agent.training.create_job(datasets=[ds.id], base_model="tiny", steps=2, batch_size=8,
                                                        max_length=64, loss="custom",
                                                        custom_loss=ATTACK % targets).id, timeout=300)
    assert job.status == "failed" and job.step == 0, (job.status, job.error)
    error = job.error or ""
    assert error.startswith("step 1: custom loss failed") and "RuntimeError: uid=" in error, error
    got = _fields(error)
    print(f"\nthe loss saw: {got}")
    # it ran as an unprivileged uid (the sandbox uid pool's when the gym is root)
    assert int(got["uid"]) != 0 and int(got["gid"]) != 0, got
    if os.geteuid() == 0:
        assert int(got["uid"]) >= 200_000
    # every canary, the data dir, /etc/shadow: not there at all (or at worst unreadable)
    for name in ("tmp", "vartmp", "home", "tmpdir", "shadow", "datadir"):
        assert got[name].startswith("ERR:"), (name, got[name])
    # the home dir is absent or holds nothing but the path down to the interpreter
    lead = {Path(p).relative_to(Path.home()).parts[0] for p in (sys.prefix, sys.base_prefix)
            if Path(p).is_relative_to(Path.home())}
    assert got["roothome"].startswith("ERR:") or set(filter(None, got["roothome"][3:].split(","))) <= lead, got

    # the canary text appears nowhere the agent (or an operator reading logs) can see
    view = http.get(f"/training/v1/jobs/{job.id}", headers=bearer(key["key"])).text
    logs = agent.training.logs(job.id)
    listing = http.get("/training/v1/jobs", headers=bearer(key["key"])).text
    for _, text in canaries.values():
        for where, seen in (("error", error), ("view", view), ("logs", logs), ("list", listing)):
            assert text not in seen, where
    assert "root:" not in error  # no /etc/shadow line either
    assert len(error) <= 600
    # the scratch dir went away with the loss
    assert set(glob.glob("/tmp/rsigym-loss-*")) <= scratch_before
