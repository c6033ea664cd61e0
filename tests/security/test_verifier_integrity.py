"""A harness cannot write its own reward (security issue, item 2).

The attack: the harness answers wrong, then leaves a detached daemon — setsid, a double
fork, nohup, SIGTERM ignored — that keeps writing ``{"reward": 1}`` into the verifier's
files. When the verifier ran in the harness's own sandbox, Harbor's verifier removed stale
reward files, ran the tests (reward 0) and then read the daemon's ``reward.json``: the
official score went from 0 to 1. The benchmark here keeps Harbor's default (shared) verifier
mode in its task.toml, so what is proven is the gym's own rule — the agent's sandbox is
killed, PID namespace and all, and the verifier runs in a fresh one with only the task's
declared outputs — not the task author's care.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import rsigym
from ops.cli.main import app as operator_cli
from tests.conftest import ADMIN_TOKEN
from tests.fakes.live_gym import LiveGym, harness_archive

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
MARKER = "rsigym-forge-" + secrets.token_hex(4)
"""On the daemons' command lines, to look for survivors on the host afterwards."""

LOOP = """
import os, signal, time
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
while True:
    try:
        os.makedirs("/logs/verifier", exist_ok=True)
        open("/logs/verifier/reward.json", "w").write('{"reward": 1.0}')
        open("/logs/verifier/reward.txt", "w").write("1")
    except OSError:
        pass
    time.sleep(0.02)
"""
DOUBLE_FORK = """
import os, sys
if os.fork(): os._exit(0)
os.setsid()
if os.fork(): os._exit(0)
os.execv(sys.executable, [sys.executable, "/tmp/loop.py", *sys.argv[1:]])
"""
CONTROL = "echo 0 > /app/answer.txt\n"
"""A wrong answer (every arithmetic task here is a - b with a > b): the honest score is 0."""


def forging(sleep_s: float) -> str:
    """Answer wrong, then leave two reward-rewriting daemons that ignore SIGTERM, SIGHUP and
    SIGINT: one started with ``setsid nohup``, one that double-forks into a session of its own.
    Their output goes to /dev/null, so the harness's command really ends while they live on."""
    return CONTROL + f"""
cat > /tmp/loop.py <<'EOF'
{LOOP}
EOF
cat > /tmp/double_fork.py <<'EOF'
{DOUBLE_FORK}
EOF
( setsid nohup /usr/bin/python3 /tmp/loop.py {MARKER} >/dev/null 2>&1 & )
/usr/bin/python3 /tmp/double_fork.py {MARKER} >/dev/null 2>&1 </dev/null
sleep {sleep_s}
exit 0
"""


def _submit(live: LiveGym, script: str, name: str) -> str:
    key = live.key(track="harness")
    gym = rsigym.Gym(base_url=live.url, api_key=key["key"], timeout=120)
    harness = gym.evaluation.upload_harness(harness_archive(name, script))
    gym.submit(harness=harness.id)
    return str(key["id"])


def _survivors() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if MARKER in cmdline and "pytest" not in cmdline:
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def test_a_detached_reward_forger_does_not_change_the_official_score(live: LiveGym,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    runs = {"control": _submit(live, CONTROL, "control"),
            "forger": _submit(live, forging(0.2), "forger"),
            "forger-that-waits": _submit(live, forging(3.0), "waiter")}
    monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
    scores: dict[str, Any] = {}
    for label, run_id in runs.items():  # the operator's official scoring: avg@3 on the hidden split
        result = CliRunner().invoke(operator_cli, ["score", run_id, "--benchmark", "mini", "--wait", "--json",
                                                   "--poll", "0.5", "--url", live.url])
        assert result.exit_code == 0, result.output
        rows = {r["run_id"]: r for r in json.loads(result.stdout)["data"]}
        assert rows[run_id]["attempts"] == 3 and rows[run_id]["split"] == "official"
        scores[label] = rows[run_id]["score"]
    print(f"\nofficial avg@3: {scores}")
    assert scores["forger"] == scores["forger-that-waits"] == scores["control"] == 0.0
    # Nothing the harnesses started outlived its trial.
    assert _survivors() == []
    # What each verifier saw: the harness's wrong answer, and its own reward alone.
    by_run = {s["run_id"]: s for s in live.scores("mini")}
    details = live.http.get(f"/admin/v1/evaluation/jobs/{by_run[runs['forger']]['job_id']}/results").json()["data"]
    assert len(details) == 6 and all(d["reward"] == 0.0 and d["error"] is None for d in details)
