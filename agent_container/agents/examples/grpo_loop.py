"""A reference RL loop (GRPO-style) on the gym's Tinker API, with the unmodified ``tinker`` SDK.

Each step: sample a group of completions per prompt from the current weights, score every
completion with a reward function, take advantage = reward - the group's mean (a group whose
rewards are all equal teaches nothing and is skipped), one ``importance_sampling``
``forward_backward`` over the batch, one ``optim_step``, then save the weights for the next
step's sampler. One JSON line per step on stdout; the reward curve as JSON at the end (and a
PNG with ``--plot``, when matplotlib is installed).

The reward runs in a gym sandbox by default (the unmodified ``e2b`` SDK: one sandbox for the
whole loop, one command per step scoring the whole batch), so a reward may run untrusted or
heavy code; ``--in-process`` scores in this process instead. A reward is a Python file
defining ``reward(prompt, completion, params) -> float``: ``prompt`` and ``completion`` are
token ids, ``params`` the ``--reward-params`` JSON. Without ``--reward`` the built-in one is
the fraction of completion tokens equal to ``params["target"]`` (an easily learnt reward, for
trying the loop out).

Prompts: ``--prompts FILE``, one JSON list of token ids per line; without it, two prompts in
the ``tiny`` model's token ids. Copy this file and change what you need: it imports the
``tinker`` and ``e2b`` SDKs and the standard library only.

    export RSIGYM_URL=... RSIGYM_API_KEY=...          # the gym and your run key
    python grpo_loop.py --steps 10 --group 8 --max-tokens 8 --lr 1e-2 --reward-params '{"target": 21}'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import tinker
from tinker import types

TINY_PROMPTS = [[39, 83, 89, 273, 297, 21, 225, 22, 225, 23],  # the tiny model's "Count: 1 2 3"
                [50, 89, 81, 70, 270, 87, 297, 24, 20, 225, 25, 21]]  # and "Numbers: 40 51"

DEFAULT_REWARD = '''
def reward(prompt, completion, params):
    """The fraction of completion tokens equal to params["target"] (a token id)."""
    if not completion:
        return 0.0
    return sum(t == params["target"] for t in completion) / len(completion)
'''

RUNNER = '''
import json, sys
ns = {}
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), ns)
batch = json.load(open(sys.argv[2]))
print(json.dumps([float(ns["reward"](b["prompt"], b["completion"], batch["params"])) for b in batch["items"]]))
'''
"""Runs in the sandbox: scores every item of one batch with the reward file, prints the list."""

Scorer = Callable[[list[tuple[list[int], list[int]]]], list[float]]


def in_process_scorer(source: str, params: dict[str, Any]) -> Scorer:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<reward>", "exec"), namespace)
    fn = namespace["reward"]
    return lambda items: [float(fn(prompt, completion, params)) for prompt, completion in items]


class SandboxScorer:
    """One e2b sandbox on the gym for the whole loop; one command per batch."""

    def __init__(self, source: str, params: dict[str, Any], url: str, key: str, timeout_s: int):
        from e2b import Sandbox

        self.params = params
        self.sbx = Sandbox.create(template="base", timeout=timeout_s, api_key=key, api_url=f"{url}/sandbox",
                                  sandbox_url=f"{url}/sandbox/envd")
        self.sbx.files.write("/home/user/reward.py", source)
        self.sbx.files.write("/home/user/runner.py", RUNNER)

    def __call__(self, items: list[tuple[list[int], list[int]]]) -> list[float]:
        batch = {"params": self.params, "items": [{"prompt": p, "completion": c} for p, c in items]}
        self.sbx.files.write("/home/user/batch.json", json.dumps(batch))
        out = self.sbx.commands.run("python3 runner.py reward.py batch.json", cwd="/home/user", timeout=120)
        scores = json.loads(out.stdout)
        if len(scores) != len(items):
            raise RuntimeError(f"the reward returned {len(scores)} scores for {len(items)} completions")
        return [float(s) for s in scores]

    def close(self) -> None:
        self.sbx.kill()


def datum(prompt: list[int], completion: list[int], logprobs: Sequence[float], advantage: float) -> types.Datum:
    """Tinker's RL datum: the model sees prompt + completion minus its last token and predicts
    each next token; prompt positions get zero advantage (no loss), completion positions the
    group advantage and the sampler's log-probabilities."""
    tokens = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    inputs: dict[str, Any] = {"target_tokens": tokens[1:],  # plain lists: the SDK makes the tensors
                              "logprobs": pad + [float(x) for x in logprobs],
                              "advantages": pad + [float(advantage)] * len(completion)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--base-model", default="tiny")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="the LoRA's init and the sampling seeds")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--loss", default="importance_sampling", choices=["importance_sampling", "ppo", "cispo"])
    p.add_argument("--prompts", type=Path, help="one JSON list of token ids per line (default: two tiny prompts)")
    p.add_argument("--reward", type=Path, help="a Python file defining reward(prompt, completion, params)")
    p.add_argument("--reward-params", default='{"target": 21}', help="JSON handed to the reward")
    p.add_argument("--in-process", action="store_true", help="score here instead of in a gym sandbox")
    p.add_argument("--out", type=Path, default=Path("grpo_curve.json"), help="the reward curve (JSON)")
    p.add_argument("--plot", type=Path, help="also draw the curve to this PNG (needs matplotlib)")
    p.add_argument("--url", default=os.environ.get("RSIGYM_URL"), help="the gym (default $RSIGYM_URL)")
    p.add_argument("--key", default=os.environ.get("RSIGYM_API_KEY"), help="the run key (default $RSIGYM_API_KEY)")
    args = p.parse_args(argv)
    if not args.url or not args.key:
        p.error("set RSIGYM_URL and RSIGYM_API_KEY (or pass --url and --key)")
    return args


def plot(curve: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    ax.plot([c["step"] for c in curve], [c["mean_reward"] for c in curve], marker="o")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    params = json.loads(args.reward_params)
    source = args.reward.read_text() if args.reward else DEFAULT_REWARD
    prompts = ([json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
               if args.prompts else TINY_PROMPTS)

    service = tinker.ServiceClient(base_url=f"{args.url.rstrip('/')}/tinker",
                                   api_key=args.key if args.key.startswith("tml-") else "tml-" + args.key)
    trainer = service.create_lora_training_client(base_model=args.base_model, rank=args.rank, seed=args.seed).result()
    # A fresh LoRA computes exactly the base model: its saved weights are step 0's sampler.
    sampler = trainer.save_weights_and_get_sampling_client().result()
    score: Scorer
    scorer = None
    if args.in_process:
        score = in_process_scorer(source, params)
    else:
        scorer = SandboxScorer(source, params, args.url.rstrip("/"), args.key.removeprefix("tml-"),
                               timeout_s=max(300, 60 * args.steps))
        score = scorer
    curve: list[dict[str, Any]] = []
    status: Literal["success", "errored"] = "errored"
    try:
        for step in range(args.steps):
            t0 = time.perf_counter()
            futures = [sampler.sample(types.ModelInput.from_ints(prompt), args.group,
                                      types.SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                                           stop=[], seed=args.seed * 1_000_003 + 1000 * step + k))
                       for k, prompt in enumerate(prompts)]
            groups = [(prompt, f.result().sequences) for prompt, f in zip(prompts, futures, strict=True)]
            items = [(prompt, list(seq.tokens)) for prompt, seqs in groups for seq in seqs]
            rewards = score(items)

            data, at, skipped = [], 0, 0
            for prompt, seqs in groups:
                group_rewards = rewards[at:at + len(seqs)]
                at += len(seqs)
                mean = statistics.fmean(group_rewards)
                if all(r == group_rewards[0] for r in group_rewards):
                    skipped += 1  # every advantage would be 0: nothing to learn from this group
                    continue
                for seq, r in zip(seqs, group_rewards, strict=True):
                    if seq.tokens:
                        data.append(datum(prompt, list(seq.tokens), seq.logprobs or [], r - mean))
            loss = None
            if data:
                out = trainer.forward_backward(data, args.loss).result()
                trainer.optim_step(types.AdamParams(learning_rate=args.lr)).result()
                loss = out.metrics.get("loss:sum")
                sampler = trainer.save_weights_and_get_sampling_client().result()
            row = {"step": step, "mean_reward": round(statistics.fmean(rewards), 4), "groups_skipped": skipped,
                   "data": len(data), "loss": loss, "seconds": round(time.perf_counter() - t0, 2)}
            curve.append(row)
            print(json.dumps(row), flush=True)
        status = "success"
    finally:
        if scorer is not None:
            scorer.close()
        service.close(status).result()  # ends the Tinker session (its models are unloaded)
    args.out.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items() if k != "key"},
                                    "curve": curve}, indent=1))
    if args.plot:
        plot(curve, args.plot, f"GRPO-style loop: {args.base_model}, {len(prompts)} prompts x {args.group}, "
                               f"lr {args.lr}, seed {args.seed}")
    return curve


if __name__ == "__main__":
    main(sys.argv[1:])
