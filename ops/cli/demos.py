"""``rsigym demo``: a throw-away offline gym running a whole track, or the scripted walkthrough."""

from __future__ import annotations

from typing import Annotated

import typer

from ops.cli.common import DataDirOpt


def demo(
    data_dir: DataDirOpt = None,
    port: Annotated[int, typer.Option("--port")] = 8700,
    agent: Annotated[str, typer.Option("--agent", help="The research agent of the Joint run: baseline (scripted, no "
                                       "LLM) or dag (the reviewer-guided research DAG on the stand-in model).")] = "baseline",
    tasks_per_split: Annotated[int | None, typer.Option(
        "--tasks-per-split", min=2, help="Shorten the demo: the arithmetic benchmark cut to its first N tasks "
        "of each split (validation, evaluation and scoring run fewer trials).")] = None,
    walkthrough: Annotated[bool, typer.Option("--walkthrough", help="Instead of a track: one scripted client "
                                              "through every service (keys, rollout, training, inference, a sandbox, "
                                              "child-key budgets, evaluation, audit, score).")] = False,
    model: Annotated[str, typer.Option("--model", help="--walkthrough's base model: tiny or smollm2.")] = "tiny",
    keep: Annotated[bool, typer.Option("--keep", help="Keep the fresh data dir the demo makes (its logs, audit "
                                       "and report); without --data-dir it is removed when the demo ends.")] = False,
    generations: Annotated[int | None, typer.Option(
        "--generations", min=1, help="The recursive loop: N runs of the agent, each started from the previous "
        "one's accepted system (rsigym run start --from), each audited and scored; prints the chain's report "
        "(each generation against its initial system and against generation 0).")] = None,
) -> None:
    """Start a throw-away offline gym and run a whole Joint track on it: launch the agent, watch it,
    audit the run, score its submission (avg@3) and print the RSI-Index report (--generations N: N
    runs, each from the previous accepted system, and the chain's report). A busy --port (another
    gym) moves the demo's gym to a free one; it never talks to a gym it did not start."""
    if generations is not None:
        from ops.demo_agent import AGENT_ARGS
        from ops.demo_generations import run_generations_demo

        if walkthrough or model != "tiny":
            raise typer.BadParameter("--generations runs the agent's track on the tiny model (no --walkthrough, "
                                     "no --model)")
        if agent not in AGENT_ARGS:
            raise typer.BadParameter(f"--agent is one of {', '.join(AGENT_ARGS)}")
        raise typer.Exit(run_generations_demo(generations, data_dir=data_dir, port=port, agent=agent,
                                              tasks_per_split=tasks_per_split, keep=keep))
    if not walkthrough:
        from ops.demo_agent import AGENT_ARGS, run_agent_demo

        if agent not in AGENT_ARGS:
            raise typer.BadParameter(f"--agent is one of {', '.join(AGENT_ARGS)}")
        if model != "tiny":
            raise typer.BadParameter("--model applies to --walkthrough (the track trains its preset base model)")
        raise typer.Exit(run_agent_demo(agent, data_dir=data_dir, port=port, tasks_per_split=tasks_per_split,
                                        keep=keep))
    from ops.demo import run_demo

    if model not in ("tiny", "smollm2"):
        raise typer.BadParameter("--model is tiny or smollm2")
    raise typer.Exit(run_demo(data_dir=data_dir, port=port, model=model, tasks_per_split=tasks_per_split, keep=keep))
