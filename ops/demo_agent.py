"""``rsigym demo [--agent baseline|dag]`` (``make demo``): a whole track, as an operator runs one.

A throw-away embedded gym, offline (the stand-in serves the teacher, the judge and — for the DAG
agent — the agent-route model inside the gym); the bundled benchmarks (arithmetic, shell) registered
and validated; a Joint run launched with ``rsigym run start --task joint-arithmetic --agent A``, its
progress shown with ``rsigym watch RUN --once`` while it runs; then the operator's side: the run
audited, its submission scored (avg@3 on the official split, on the operator's budget) and the
RSI-Index report written. It passes when the agent exited 0, the audit accepted the run and the
run's RSI-Index is positive.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.display_text import plain
from kit.settings import default_models_dir
from ops.demo_common import (
    BENCHMARKS,
    BUNDLED,
    background_process,
    console,
    demo_data_dir,
    own_gym,
    pick_port,
    rsigym_cli,
    trimmed_benchmarks,
)
from ops.launcher import show_run

TASK = "joint-arithmetic"
AGENT_ARGS: dict[str, list[str]] = {
    # 800 steps at 6e-3: the recipe that learns held-out subtraction on every build of the base (demo.py)
    "baseline": ["--rows", "1500", "--steps", "800", "--limit", "20", "--votes", "3", "--poll", "1"],
    "dag": ["--rows", "1500", "--steps", "800", "--limit", "20", "--max-rounds", "1", "--poll", "1"],
}
SHORT_ARGS: dict[str, list[str]] = {  # the suite's run: the benchmark cut short, so is the work
    "baseline": ["--rows", "400", "--steps", "800", "--limit", "4", "--votes", "2", "--poll", "0.5"],
    "dag": ["--rows", "400", "--steps", "800", "--limit", "4", "--max-rounds", "1", "--poll", "0.5"],
}
CONFIG = """[ledger]
reservation_ttl_s = 600

[[rollout.models]]
name = "teacher"
litellm_model = "openai/standin"
served_by = "standin"
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0

[[rollout.models]]
name = "judge"
litellm_model = "openai/standin"
served_by = "standin"
input_usd_per_mtok = 3.0
output_usd_per_mtok = 15.0

[[agent_models]]
name = "lead"
litellm_model = "openai/standin"
served_by = "standin"
input_usd_per_mtok = 3.0
output_usd_per_mtok = 15.0

[audit]
judge_model = "judge"
"""


def _index_of(report: dict[str, Any], run_id: str) -> float | None:
    return next((r["rsi_index"] for r in report.get("runs", []) if r["run_id"] == run_id), None)


@dataclass
class DemoGym:
    """A demo's own gym, up, its bundled benchmarks registered and validated."""

    data: Path
    url: str
    config: Path
    operator_env: dict[str, str]

    def cli(self, *args: str, ok_codes: tuple[int, ...] = (0,)) -> str:
        return rsigym_cli(*args, env=self.operator_env, ok_codes=ok_codes)


@dataclass
class Launched:
    run: str
    shown: dict[str, Any]
    """``rsigym run show RUN --json`` once the agent exited."""
    submitted: str
    """The agent's last ``submitted: …`` line (or what it said when it submitted nothing)."""


@contextmanager
def demo_gym(data: Path, port: int, tasks_per_split: int | None, config_text: str = CONFIG,
             what: str = "stand-in teacher, judge and agent model") -> Iterator[DemoGym]:
    """Start the gym (``rsigym up``) on ``data``/``port`` and register the bundled benchmarks (the
    shortened copies when ``tasks_per_split``); stopped when the block ends."""
    config = data / "gym.toml"
    config.write_text(config_text)
    url = f"http://127.0.0.1:{port}"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}
    models = Path(os.environ.get("RSIGYM_MODELS_DIR") or default_models_dir())
    platform_env = {**base_env, "RSIGYM_DATA_DIR": str(data), "RSIGYM_MODELS_DIR": str(models)}
    gym = DemoGym(data, url, config, {**base_env, "RSIGYM_URL": url, "RSIGYM_DATA_DIR": str(data)})
    with background_process([sys.executable, "-m", "ops.cli.main", "up", "--config", str(config), "--data-dir", str(data),
                   "--port", str(port)], platform_env, f"{url}/healthz", data / "gym.log", start_timeout=1200,
                   ready=own_gym(url, data)):
        console.print(f"[green]gym up[/green] at {url}, offline ({what})")
        benchmarks = ([BENCHMARKS / name for name in BUNDLED] if tasks_per_split is None
                      else trimmed_benchmarks(data / "benchmarks", tasks_per_split))
        for path in benchmarks:  # the audit checks the run's data against every registered benchmark
            registered = json.loads(gym.cli("benchmarks", "register", str(path), "--wait", "--json"))
            if registered["status"] != "ready":
                raise SystemExit(f"benchmark {path} was not validated: {registered.get('validation')}")
            console.print(f"rsigym benchmarks register {path} --wait → ready "
                          f"({registered['validation']['tasks']} tasks: every oracle 1, every empty answer 0)")
        yield gym


def launch_and_follow(gym: DemoGym, agent: str, args: list[str], watch_every_s: float,
                      start_options: tuple[str, ...] = ()) -> Launched:
    """``rsigym run start --task TASK --agent A [start_options] -- ARGS``, its progress shown with
    ``rsigym watch RUN --once`` until the agent exits."""
    started = json.loads(gym.cli("run", "start", "--task", TASK, "--agent", agent, "--config", str(gym.config),
                                 *start_options, "--json", "--", *args))
    run = started["run"]
    console.print(f"rsigym run start --task {TASK} --agent {agent} {' '.join(start_options)} → run {run} "
                  f"({' '.join(args)})")
    shown: dict[str, Any] = {}
    last_frame = 0.0
    while True:
        # What `rsigym run show RUN --json` prints, read here: a CLI process every 2 s (~0.75 s of CPU
        # each, mostly imports) took a third of a core from the agent's training on a 2-core box.
        shown = show_run(gym.data, run).model_dump(mode="json")
        if shown["status"] != "running":
            break
        if time.monotonic() - last_frame >= watch_every_s:
            print(gym.cli("watch", run, "--once"), flush=True)  # rendered at 200 columns
            last_frame = time.monotonic()
        time.sleep(2)
    print(gym.cli("watch", run, "--once"), flush=True)
    log = gym.cli("run", "logs", run)
    submitted = [line for line in log.splitlines() if line.startswith("submitted: ")]
    console.print(plain(f"the agent {shown['status']} with code {shown.get('exit_code')}; "  # its log: its words
                        + (submitted[-1] if submitted else "it submitted nothing")))
    return Launched(run, shown, submitted[-1] if submitted else "")


def audit_and_score(gym: DemoGym, run: str, out: str = "audit") -> dict[str, Any]:
    """The operator's side of one run: ``rsigym audit RUN`` and ``rsigym score RUN --attempts 3``
    (avg@3, the official split); the audit's JSON. A flagged run is not scored."""
    audited = json.loads(gym.cli("audit", run, "--json", "--out", str(gym.data / out), ok_codes=(0, 2)))
    console.print(f"rsigym audit {run}: {audited['status']} (hacking rate {audited['hacking_rate']}); "
                  + ", ".join(f"{c['name']} {c['verdict']}" for c in audited["checks"]))
    if audited["status"] == "accepted":
        console.print(f"rsigym score {run} --attempts 3 --wait …")
        gym.cli("score", run, "--attempts", "3", "--benchmark", "arithmetic", "--wait")
    return audited


def run_agent_demo(agent: str, data_dir: Path | None = None, port: int = 8700, tasks_per_split: int | None = None,
                   watch_every_s: float = 20.0, keep: bool = False) -> int:
    """The demo on a gym of its own: on ``port``, or a free one if that is busy; in ``data_dir``, or a
    fresh one removed at the end unless ``keep``."""
    with demo_data_dir(data_dir, f"rsigym-demo-{agent}-", keep) as data:
        return _run_agent_demo(agent, data, pick_port(port), tasks_per_split, watch_every_s)


def _run_agent_demo(agent: str, data: Path, port: int, tasks_per_split: int | None, watch_every_s: float) -> int:
    console.rule(f"[bold]RSIGym demo: a Joint run of the {agent} agent")
    console.print(f"data dir {data}")
    with demo_gym(data, port, tasks_per_split) as gym:
        args = (AGENT_ARGS if tasks_per_split is None else SHORT_ARGS)[agent]
        launched = launch_and_follow(gym, agent, args, watch_every_s)
        run = launched.run
        console.rule("operator")
        audited = audit_and_score(gym, run)
        print(gym.cli("report", "--out", str(data / "report"), "--split", "official"), flush=True)
        report = json.loads((data / "report" / "report.json").read_text())
        index = _index_of(report, run)
        console.print(f"report: {data / 'report' / 'report.md'} and its charts; RSI-Index of run {run}: {index}")
    ok = launched.shown.get("exit_code") == 0 and audited["status"] == "accepted" and index is not None and index > 0
    console.rule("[green]demo passed" if ok else "[red]demo failed")
    return 0 if ok else 1
