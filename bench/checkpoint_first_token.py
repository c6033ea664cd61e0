"""Checkpoint → first token: how soon a freshly registered checkpoint answers.

Runs an embedded gym on loopback with the tiny base model, trains N one-step LoRA jobs and,
for each, measures from the moment the checkpoint is registered (the job's checkpoint appears
in the run's list; polled every 5 ms) to the first streamed token through the gateway — the
adapter is hot-loaded on that request. The baseline is the same request to the (already
loaded) base model, measured in the same run.

    .venv/bin/python bench/checkpoint_first_token.py [--checkpoints 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import httpx
from _common import ROOT, bench_dir, serve

from kit.settings import GymSettings, ProviderSecrets, default_models_dir
from ops.builder import build_embedded

ROWS = "\n".join(['{"messages": [{"role": "user", "content": "What is 3 - 1?"}, {"role": "assistant", "content": "2"}]}'] * 16)


def first_token_s(http: httpx.Client, key: str, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "What is 9 - 4?"}], "max_tokens": 4,
            "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    with http.stream("POST", "/inference/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - t0
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--models-dir", type=Path, default=default_models_dir())
    args = parser.parse_args()
    with bench_dir() as data:
        gym = build_embedded(GymSettings(data_dir=data, admin_token="bench-admin", models_dir=args.models_dir),
                             provider_secrets=ProviderSecrets({}), run_reaper=False)
        with serve(gym.app) as url, httpx.Client(base_url=url, timeout=300) as http:
            admin = {"Authorization": "Bearer bench-admin"}
            key = http.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 100}, headers=admin).json()["key"]
            auth = {"Authorization": f"Bearer {key}"}
            ds = http.post("/training/v1/datasets", content=ROWS.encode(), headers=auth).json()["id"]
            for _ in range(3):
                first_token_s(http, key, "tiny")  # warm the base model
            base_times, ckpt_times = [], []
            for i in range(args.checkpoints):
                known = {c["id"] for c in http.get("/training/v1/checkpoints", headers=auth).json()["data"]}
                http.post("/training/v1/jobs", headers=auth, json={"datasets": [ds], "base_model": "tiny", "steps": 1,
                                                                    "batch_size": 4, "max_length": 32, "seed": i})
                while True:
                    fresh = [c["id"] for c in http.get("/training/v1/checkpoints", headers=auth).json()["data"] if c["id"] not in known]
                    if fresh:
                        break
                    time.sleep(0.005)
                ckpt_times.append(first_token_s(http, key, fresh[0]))
                base_times.append(first_token_s(http, key, "tiny"))
        gym.service_apps["training"].state.training.runner.shutdown()
    med_c, med_b = statistics.median(ckpt_times), statistics.median(base_times)
    print(f"checkpoint first token, {args.checkpoints} fresh checkpoints (tiny base, embedded gym, through the gateway)")
    print(f"  fresh checkpoint: median {med_c * 1000:7.1f} ms  max {max(ckpt_times) * 1000:7.1f} ms")
    print(f"  base model      : median {med_b * 1000:7.1f} ms  max {max(base_times) * 1000:7.1f} ms")
    print(f"  ratio checkpoint/base (median): {med_c / med_b:.2f}x")


if __name__ == "__main__":
    assert ROOT
    main()
