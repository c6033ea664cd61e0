"""Tinker API overhead: training steps per second through the unmodified ``tinker`` SDK against
the same steps run directly on the engine.

One step = ``forward_backward`` + ``optim_step`` (Adam) on one fixed batch of RL-shaped data
(``--data`` sequences of ``--tokens`` tokens, ``importance_sampling`` by default), the tiny base
model, LoRA rank 8, on CPU. The SDK's steps go to the gym in a process of its own (served as
``rsigym up`` serves it, one torch thread) through the gateway's ``/tinker`` route; the baseline
is a ``LoopSession`` (services/training/loop/, what the gym's Tinker API runs) in this process,
also on one torch thread. Steps alternate between the two, the order turning each round; prints
steps/s and the per-step p50 of each and the ratio (SDK time / direct time).

    .venv/bin/python bench/tinker_overhead.py [--rounds 30] [--data 16] [--tokens 17] [--loss importance_sampling]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

from _common import gym_process, pct

from kit.config import BaseModel_
from kit.settings import default_models_dir


def batch(n: int, length: int, loss: str, seed: int = 0) -> list[tuple[list[int], dict[str, list[Any]]]]:
    """``n`` sequences of ``length`` input tokens with their loss inputs, as plain lists."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        full = [rng.randrange(3, 400) for _ in range(length + 1)]
        inputs: dict[str, list[Any]] = {"target_tokens": full[1:]}
        if loss == "cross_entropy":
            inputs["weights"] = [1.0] * length
        else:
            advantage = rng.choice([-1.0, 1.0]) * rng.random()
            inputs["logprobs"] = [-rng.uniform(0.5, 6.0) for _ in range(length)]
            inputs["advantages"] = [0.0] * (length // 2) + [advantage] * (length - length // 2)
        rows.append((full[:-1], inputs))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--data", type=int, default=16, help="sequences per batch")
    parser.add_argument("--tokens", type=int, default=17, help="input tokens per sequence")
    parser.add_argument("--loss", default="importance_sampling", choices=["importance_sampling", "cross_entropy"])
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()

    os.environ.setdefault("TINKER_TELEMETRY", "0")
    import tinker
    import torch
    from tinker import types

    from services.models.loading import resolve_model_dir
    from services.training.loop.session import LoopSession
    from services.training.loop.types import AdamParams, Datum

    torch.set_num_threads(1)  # as the gym's process (OMP_NUM_THREADS=1)
    rows = batch(args.data, args.tokens, args.loss)
    base_path = resolve_model_dir(BaseModel_(name="tiny", path="builtin:tiny", train_usd_per_mtok=0, prefill_usd_per_mtok=0,
                                                  sample_usd_per_mtok=0), default_models_dir())
    direct_session = LoopSession(base_path=base_path, rank=8, seed=0)
    direct_data = [Datum(tokens, inputs) for tokens, inputs in rows]
    sdk_data = [types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=dict[str, Any](inputs))
                for tokens, inputs in rows]  # plain lists: the SDK makes the tensors

    with gym_process("", key_request={"track": "joint", "budget_usd": 1000}) as gym:
        service = tinker.ServiceClient(base_url=f"{gym.url}/tinker", api_key="tml-" + gym.key)
        trainer = service.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()

        def direct() -> float:
            t0 = time.perf_counter()
            direct_session.forward_backward(direct_data, args.loss)
            direct_session.optim_step(AdamParams(learning_rate=args.lr))
            return time.perf_counter() - t0

        def through_sdk() -> float:
            t0 = time.perf_counter()
            trainer.forward_backward(sdk_data, args.loss).result()
            trainer.optim_step(types.AdamParams(learning_rate=args.lr)).result()
            return time.perf_counter() - t0

        for _ in range(args.warmup):
            direct(), through_sdk()
        direct_times: list[float] = []
        sdk_times: list[float] = []
        for i in range(args.rounds):
            if i % 2:
                direct_times.append(direct())
                sdk_times.append(through_sdk())
            else:
                sdk_times.append(through_sdk())
                direct_times.append(direct())
        service.close("success").result()
    load = os.getloadavg()[0]

    def rate(times: list[float]) -> float:
        return len(times) / sum(times)

    tokens = args.data * args.tokens
    print(f"tinker overhead: {args.rounds} steps each (forward_backward + optim_step), {args.loss}, "
          f"batch {args.data} x {args.tokens} tokens ({tokens}), tiny model, LoRA rank 8, CPU, 1 torch thread each")
    print(f"  direct LoopSession : {rate(direct_times):6.2f} steps/s  p50 {pct(direct_times, 50) * 1000:7.1f} ms")
    print(f"  tinker SDK via gym : {rate(sdk_times):6.2f} steps/s  p50 {pct(sdk_times, 50) * 1000:7.1f} ms")
    added = [s - d for s, d in zip(sdk_times, direct_times, strict=True)]
    print(f"  added per step (paired): p50 {pct(added, 50) * 1000:7.1f} ms  mean {statistics.mean(added) * 1000:7.1f} ms")
    print(f"  ratio SDK / direct time: {sum(sdk_times) / sum(direct_times):.2f}x "
          f"(steps/s {rate(sdk_times) / rate(direct_times):.2f} of direct); 1-min load after: {load:.2f}")


if __name__ == "__main__":
    main()
