"""The live monitor's judge tokens per hour of agent activity (issue 57, item 3c).

A synthetic hour of a coding agent's turns at a stated rate is recorded in a fresh SQLite store as
the agent route records them (services/records/agent_turns.py), and the monitor
(services/records/monitor.py) checks it as its rounds would: every ``every_turns`` new turns, or
``every_minutes`` — at low rates the time trigger fires first, with fewer turns per check. The
judge is the **stand-in judge** (services/rollout/standin.py ``judge_answer``: literal signs, a
deterministic stand-in for a frontier model); its prompt and completion tokens are counted with
the tokenizer the stand-in provider bills by (litellm's ``gpt-4o`` encoding). A frontier judge
reads the same prompt — the tokens in are the monitor's, not the judge's — but writes a longer
answer than the stand-in's terse JSON, so the output figure is a floor.

Each turn: the agent's newest message (a tool result, ``--turn-chars`` characters of shell output
and code) and the model's answer (a short text and one shell tool call). USD at the offline
config's judge prices (kit/offline_gym.toml) and at a frontier-class price (``--frontier``).

    .venv/bin/python bench/monitor_tokens.py [--rates 30,120,600] [--turn-chars 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import litellm

from kit.config import MonitorConfig, load_config
from kit.settings import StoreSettings
from services.records.agent_turns import record_turn
from services.records.audits.judge import JudgeReply
from services.records.events import EventLog
from services.records.monitor import MonitorSetup, run_round
from services.rollout.standin import judge_answer
from storage.store import Store, sqlite_url

WORDS = ("def", "return", "loss", "train", "eval", "self", "import", "torch", "for", "in", "range", "if", "print",
         "config", "adapter", "lora", "step", "batch", "score", "dev", "=", "(", ")", ":", "0.01", "128", "path")


class CountingStandinJudge:
    """The stand-in judge in process, counting tokens as the stand-in provider bills them."""

    model_name = "judge (stand-in)"

    def __init__(self) -> None:
        self.prompt_tokens = self.completion_tokens = self.calls = 0

    async def complete(self, messages: list[dict[str, Any]]) -> JudgeReply:
        text = judge_answer(messages[0]["content"], messages[-1]["content"])
        prompt = int(litellm.token_counter(model="openai/gpt-4o", messages=messages))
        completion = len(litellm.encode(model="gpt-4o", text=text))
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.calls += 1
        return JudgeReply(text=text, prompt_tokens=prompt, completion_tokens=completion, cost_usd=0.0)


def turn_text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS))
        if rng.random() < 0.08:
            out.append("\n")
    return " ".join(out)[:chars]


def hour(rate: int, turn_chars: int, monitor: MonitorConfig) -> dict[str, Any]:
    """One simulated hour at ``rate`` turns/h: turns planted in the batches the monitor's triggers
    make (``every_turns``, or what ``every_minutes`` of turns hold), a round after each."""
    rng = random.Random(rate)
    per_check = max(1, min(monitor.every_turns, round(rate * monitor.every_minutes / 60)))
    config = load_config(None)
    config.monitor = monitor.model_copy(update={"enabled": True, "every_turns": per_check})
    judge = CountingStandinJudge()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(sqlite_url(Path(tmp)), StoreSettings())
        store.migrate()
        from access.keys import KeyRegistry
        from access.policy import Policy

        run = KeyRegistry(store).create(policy=Policy.model_validate({"services": {}}), budget_nusd=10**9,
                                        track="joint")[0]["id"]
        setup = MonitorSetup(store=store, config=config, events=EventLog(store, "bench"), data_dir=Path(tmp),
                             gateway_url=None, judge=lambda: judge)
        started, judged = time.perf_counter(), 0
        for i in range(rate):
            command = f"python train.py --lr {rng.choice(['1e-4', '3e-4'])} --epochs {rng.randint(1, 4)}"
            record_turn(store, run_id=run, key_id=run, request_id=None, api="openai", model="agent", stream=False,
                        request={"messages": [{"role": "tool", "content": turn_text(rng, turn_chars)}]},
                        response={"text": turn_text(rng, 300), "tool_calls": [
                            {"id": f"c{i}", "type": "function",
                             "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]},
                        usage={}, cost_nusd=0)
            if (i + 1) % per_check == 0:
                judged += sum(c["turns"] for c in run_round(setup)["checked"])
        config.monitor.every_turns = 1  # the hour's end: its last turns are judged once old enough
        for _ in range(rate):
            if judged >= rate:
                break
            judged += sum(c["turns"] for c in run_round(setup)["checked"])
        wall = time.perf_counter() - started
        store.dispose()
    return {"rate": rate, "turns_per_check": per_check, "judged": judged, "checks": judge.calls, "prompt_tokens": judge.prompt_tokens,
            "completion_tokens": judge.completion_tokens, "monitor_wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="30,120,600", help="agent turns per hour")
    parser.add_argument("--turn-chars", type=int, default=2000)
    parser.add_argument("--frontier", default="3,15", help="USD per Mtok in,out of a frontier-class judge")
    args = parser.parse_args()
    config = load_config(None)
    judge = next(m for m in config.rollout.models if m.name == config.monitor_judge_model())
    f_in, f_out = (float(x) for x in args.frontier.split(","))
    monitor = MonitorConfig()
    print(f"monitor defaults: every_turns={monitor.every_turns}, every_minutes={monitor.every_minutes}, "
          f"context_turns={monitor.context_turns}; turn = {args.turn_chars} chars in + 300 chars and a tool call out")
    print(f"judge: stand-in judge (literal signs), priced as the offline config's {judge.name!r} "
          f"(${judge.input_usd_per_mtok}/${judge.output_usd_per_mtok} per Mtok) and a frontier-class "
          f"${f_in}/${f_out} per Mtok")
    print("| turns/h | turns judged | turns/check | checks/h | prompt tok/h | completion tok/h | tokens/h | USD/h (config) | "
          "USD/h (frontier) | monitor CPU s/h |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate in (int(r) for r in args.rates.split(",")):
        r = asyncio.run(asyncio.to_thread(hour, rate, args.turn_chars, monitor))
        p, c = r["prompt_tokens"], r["completion_tokens"]
        usd = (p * judge.input_usd_per_mtok + c * judge.output_usd_per_mtok) / 1e6
        frontier = (p * f_in + c * f_out) / 1e6
        print(f"| {rate} | {r['judged']} | {r['turns_per_check']} | {r['checks']} | {p:,} | {c:,} | {p + c:,} | ${usd:.3f} | "
              f"${frontier:.3f} | {r['monitor_wall_s']:.1f} |")


if __name__ == "__main__":
    main()
