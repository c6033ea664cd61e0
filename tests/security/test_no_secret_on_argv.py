"""No secret on a command line: ``/proc/*/cmdline`` is every local user's to read, so no process
the gym starts may carry a key, a token or the internal secret in its argv. A watcher reads every
process's command line on the host every few milliseconds while the gym launches an agent, starts
a sandbox (with a key-shaped value in its environment), runs an evaluation (trials mint a sandbox
key and a model-door key each) and trains with a custom loss (a sandbox of its own); it asserts
what a local user scraping ``/proc`` got: nothing."""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.conftest import ADMIN_TOKEN
from tests.e2e.test_launcher import report, rsigym, wait_for_exit
from tests.fakes.live_gym import LiveGym, harness_archive

KEY_SHAPE = re.compile(rb"rsk-[A-Za-z0-9_-]{16,}")
"""Any gym key (run, child, trial sandbox, model door): ``rsk-`` and its random part."""
ROWS = [{"messages": [{"role": "user", "content": f"Repeat: red lion {i}"},
                      {"role": "assistant", "content": f"red lion {i}"}]} for i in range(8)]
LOSS = '''
import torch.nn.functional as F

def loss(logits, labels, mask):
    return F.cross_entropy(logits[mask.bool()], labels[mask.bool()])
'''


class ArgvWatch:
    """Every command line seen on the host while it runs; those holding a secret, apart."""

    def __init__(self, literals: list[bytes]):
        self.literals = literals
        self.seen: dict[int, bytes] = {}
        self.leaks: list[tuple[int, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        mine = os.getpid()
        while not self._stop.is_set():
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) == mine:
                    continue
                try:
                    cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                if not cmd or self.seen.get(int(entry)) == cmd:
                    continue
                self.seen[int(entry)] = cmd
                if KEY_SHAPE.search(cmd) or any(secret in cmd for secret in self.literals):
                    self.leaks.append((int(entry), cmd))
            time.sleep(0.003)

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def started(self, word: bytes) -> int:
        return sum(1 for cmd in self.seen.values() if word in cmd)


@pytest.fixture
def operator_env(live: LiveGym, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    data_dir = tmp_path / "runs-data"
    data_dir.mkdir()
    monkeypatch.setenv("RSIGYM_URL", live.url)
    monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("RSIGYM_DATA_DIR", str(data_dir))
    yield data_dir


def test_no_process_the_gym_starts_has_a_secret_on_its_command_line(live: LiveGym, operator_env: Path) -> None:
    internal = live.gym.gateway.context.settings.internal_secret
    literals = [ADMIN_TOKEN.encode(), *([internal.encode()] if internal else [])]
    run = live.key(track="joint")
    agent, sdk = live.agent(run), live.sdk(run)
    with ArgvWatch(literals) as watch:
        # a launched agent (the run key reaches it through its environment)
        launched = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "scripted", "--json")["run"]
        # a sandbox whose environment holds a key-shaped value, and a command in it
        box = Sandbox.create(template="base", timeout=60, envs={"MY_TOKEN": "rsk-" + secrets.token_urlsafe(24)},
                             api_key=run["key"], api_url=f"{live.url}/sandbox", sandbox_url=f"{live.url}/sandbox/envd")
        assert box.commands.run("test -n \"$MY_TOKEN\" && echo set").stdout.strip() == "set"
        box.kill()
        # an evaluation: each trial gets a sandbox key and a model-door key of its own
        harness = agent.post("/evaluation/v1/harnesses", content=harness_archive("echo", "echo 0 > /app/answer.txt\n"))
        job = agent.post("/evaluation/v1/jobs", json={"benchmark": "mini", "split": "dev", "model": "tiny",
                                                      "harness": harness.json()["id"], "limit": 1}).json()
        # a custom loss, in a sandbox of its own
        dataset = sdk.training.upload_dataset(ROWS)
        training = sdk.training.create_job(datasets=[dataset.id], base_model="tiny", steps=1, batch_size=8,
                                           max_length=64, loss="custom", custom_loss=LOSS)
        assert live.wait_job(agent, job["id"])["status"] == "succeeded"
        assert sdk.training.wait(training.id, timeout=300).status == "succeeded"
        shown = wait_for_exit(launched, tries=600)
    assert shown["status"] == "exited" and shown["exit_code"] == 0, rsigym("run", "logs", launched)
    assert report(rsigym("run", "logs", launched))["balance"][0] == 200  # the key did reach the agent
    # The watcher saw the processes the gym started: bubblewrap for the launched agent, the
    # sandbox, the trial and the loss, the supervisor, the agent itself.
    assert watch.started(b"bwrap") >= 4 and watch.started(b"ops.launcher\0supervise") == 1, watch.seen
    assert watch.started(b"/agent/scripted.py") >= 1
    assert watch.leaks == [], [(pid, cmd.replace(b"\0", b" ")[:300]) for pid, cmd in watch.leaks]
    rsigym("run", "stop", launched)  # ends the run at the gateway too
