"""``rsigym demo --generations N``: the recursive loop on one machine, offline.

Generation 0 is the base model with the minimal harness. Generation 1 is a Joint run of the agent
started as ``make demo`` starts one; generation k + 1 is started with ``rsigym run start --from RUN``
on generation k's run, so its initial system is generation k's scored, audit-accepted submission
(its checkpoint and its harness). Every generation is audited and scored the same way (avg@3 on the
same official tasks), and the chain's report (``rsigym report --chain RUN``) measures each
generation against its own initial system and against generation 0, with a chart of the official
score by generation.

``research_model_from_previous`` (the suite's second loop test): from generation 2 on, the agent's
own model on the agent route is served by the gym itself from the previous generation's accepted
checkpoint (``--agent-model gym:from:RUN``) — the model that generation built is the researcher of
the next.

It passes when every generation's agent exited 0, every audit accepted its run, every generation
after the first started from the one before (its initial system is that one's submission), and the
last generation's RSI-Index against generation 0 is positive.

With the tiny model this shows the mechanics, not self-improvement worth the name: the tiny model
learns the arithmetic benchmark in one generation (later ones have little headroom) and, as a
research agent, answers no plan (the DAG agent falls back to trying every option). docs/
operator-guide.md says what it takes to mean more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ops.demo_agent import AGENT_ARGS, SHORT_ARGS, DemoGym, audit_and_score, demo_gym, launch_and_follow
from ops.demo_common import console, demo_data_dir, pick_port

MODEL_AGENTS = ("dag",)
CONTINUE_STEPS = 200
"""Training steps of a generation after the first (the first: 800, the recipe that learns held-out
subtraction from the base model on every build of it; ops/demo_agent.py)."""
"""The demo's agents that think with a model on the agent route."""


def run_generations_demo(generations: int, data_dir: Path | None = None, port: int = 8700,
                         tasks_per_split: int | None = None, agent: str = "baseline",
                         agents: list[str] | None = None, research_model_from_previous: bool = False,
                         watch_every_s: float = 20.0, keep: bool = False) -> int:
    """``generations`` runs, each from the previous one's accepted system, each of ``agent`` (or
    ``agents[k]`` for generation k + 1); ``research_model_from_previous``: an agent that thinks with
    a model (dag) gets the previous generation's checkpoint as that model."""
    if generations < 1:
        raise ValueError("generations must be at least 1")
    plan = agents or [agent] * generations
    if len(plan) != generations:
        raise ValueError("give one agent per generation")
    with demo_data_dir(data_dir, "rsigym-demo-generations-", keep) as data:
        console.rule(f"[bold]RSIGym demo: {generations} generations, each starting from the last accepted system")
        console.print(f"data dir {data}")
        with demo_gym(data, pick_port(port), tasks_per_split) as gym:
            chain = _chain(gym, plan, tasks_per_split, research_model_from_previous, watch_every_s)
            if not chain:
                console.rule("[red]demo failed")
                return 1
            report = _chain_report(gym, chain[-1]["run"])
    ok = all(g["exit_code"] == 0 and g["audit"] == "accepted" for g in chain) and len(chain) == generations \
        and _index_vs_gen0(report, chain[-1]["run"]) is not None and (_index_vs_gen0(report, chain[-1]["run"]) or 0) > 0
    console.rule("[green]demo passed" if ok else "[red]demo failed")
    return 0 if ok else 1


def _chain(gym: DemoGym, plan: list[str], tasks_per_split: int | None, research_model_from_previous: bool,
           watch_every_s: float) -> list[dict[str, Any]]:
    chain: list[dict[str, Any]] = []
    previous: str | None = None
    for generation, who in enumerate(plan, start=1):
        console.rule(f"generation {generation}" + ("" if previous is None else f": from run {previous}"))
        options: tuple[str, ...] = ("--seed", str(generation))  # each generation asks for new data
        if previous is not None:
            options += ("--from", previous)
            if research_model_from_previous and who in MODEL_AGENTS:
                options += ("--agent-model", f"gym:from:{previous}")
        args = (AGENT_ARGS if tasks_per_split is None else SHORT_ARGS)[who]
        if previous is not None:  # it trains on from an already-trained checkpoint: a quarter of the steps
            args = [*args, "--steps", str(CONTINUE_STEPS)]
        launched = launch_and_follow(gym, who, args, watch_every_s, options)
        entry = {"generation": generation, "run": launched.run, "agent": who,
                 "exit_code": launched.shown.get("exit_code"), "audit": None}
        chain.append(entry)
        if not launched.submitted or launched.submitted.endswith("null"):  # nothing to audit, score or build on
            console.print(f"[red]generation {generation} submitted nothing: the chain stops[/red]")
            break
        console.rule("operator")
        entry["audit"] = audit_and_score(gym, launched.run, out=f"audit-gen{generation}")["status"]
        if entry["audit"] != "accepted":  # a flagged system is no starting point: the chain stops here
            console.print(f"[red]generation {generation} was not accepted: the chain stops[/red]")
            break
        previous = launched.run
    return chain


def _chain_report(gym: DemoGym, last_run: str) -> dict[str, Any]:
    out = gym.data / "report"
    print(gym.cli("report", "--chain", last_run, "--out", str(out), "--split", "official"), flush=True)
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    console.print(f"report: {out / 'report.md'} (the chain's table and chart)")
    return report


def _index_vs_gen0(report: dict[str, Any], run_id: str) -> float | None:
    """The run's RSI-Index against generation 0, from report.json (a generation-1 run's initial
    system is generation 0: its own index)."""
    for row in report.get("runs", []):
        if row.get("run_id") == run_id:
            generation = row.get("generation")
            value = row.get("rsi_index") if generation is None else generation["rsi_index_vs_generation_0"]["rsi_index"]
            return None if value is None else float(value)
    return None
